import assert from "node:assert/strict";
import { test } from "node:test";

import { client, rejectsWithCode } from "./live.js";

test("a cluster router lists its nodes and answers one by name; a single bothyd says it is no cluster", async () => {
  const info = await client.info();
  if (info.cluster === undefined) {
    await rejectsWithCode(client.listNodes(), "not-a-cluster", 501);
    await rejectsWithCode(client.cordonNode("node-a"), "not-a-cluster", 501);
    return;
  }
  const nodes = await client.listNodes();
  assert.equal(nodes.length, info.cluster.nodes);
  assert.equal(nodes.filter((n) => n.live).length, info.cluster.live_nodes);
  assert.deepEqual(
    nodes.map((n) => n.name),
    nodes.map((n) => n.name).sort(),
    "the nodes are in name order",
  );
  const first = nodes[0];
  assert.ok(first !== undefined, "a cluster has a node");
  const one = await client.getNode(first.name);
  assert.equal(one.name, first.name);
  assert.equal(one.capacity.sandboxes, first.capacity.sandboxes);
  assert.ok(one.free.sandboxes <= one.capacity.sandboxes, "free within capacity");
  await rejectsWithCode(client.getNode("no-such-node"), "node-not-found", 404);
});
