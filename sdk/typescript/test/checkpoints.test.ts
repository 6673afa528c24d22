import assert from "node:assert/strict";
import { test } from "node:test";

import { client, cleanup, rejectsWithCode, removeSandbox, uniqueId } from "./live.js";

test("checkpoint, rollback and fork", async () => {
  const id = uniqueId("ckpt");
  cleanup(() => removeSandbox(id));
  // Checkpoints need the writable layer in the state directory: no disk of its own.
  await client.createSandbox({ id, start: true, resources: { disk_mb: 0 } });
  const sh = async (sandbox: string, script: string): Promise<string> => {
    const r = await client.exec(sandbox, { user: "root", command: ["sh", "-c", script] });
    assert.equal(r.exit_code, 0, r.stderr);
    return r.stdout;
  };
  await sh(id, "echo kept > /home/user/f");
  const cp = await client.createCheckpoint(id, "good");
  assert.equal(cp.name, "good");
  assert.equal(cp.mode, "copy");
  assert.ok(cp.size_bytes > 0);
  await rejectsWithCode(client.createCheckpoint(id, "good"), "checkpoint-exists", 409);

  await sh(id, "rm -rf /home/user");
  const sb = await client.rollback(id, "good");
  assert.equal(sb.id, id);
  assert.equal(sb.state, "running");
  assert.equal(await sh(id, "cat /home/user/f"), "kept\n");

  const forked = await client.forkSandbox(id, { count: 2 });
  assert.equal(forked.items.length, 2);
  for (const item of forked.items) {
    cleanup(() => removeSandbox(item.id));
    assert.equal(item.error, undefined);
    assert.equal(item.sandbox?.state, "running");
    assert.equal(await sh(item.id, "cat /home/user/f"), "kept\n");
  }

  assert.deepEqual(
    (await client.listCheckpoints(id)).items.map((c) => c.name),
    ["good"],
  );
  assert.equal((await client.getCheckpoint(id, "good")).size_bytes, cp.size_bytes);
  await client.deleteCheckpoint(id, "good");
  await rejectsWithCode(client.getCheckpoint(id, "good"), "checkpoint-not-found", 404);
  await rejectsWithCode(client.forkSandbox(id, { count: 17 }), "invalid-request", 400);
});
