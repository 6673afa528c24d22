import assert from "node:assert/strict";
import { test } from "node:test";

import { client, cleanup, rejectsWithCode, removeSandbox, uniqueId } from "./live.js";

test("health and info answer", async () => {
  const info = await client.info();
  assert.ok(info.version.length > 0);
  assert.ok(info.images.some((i) => i.name === "host"));
  assert.ok(info.limits.max_exec_output_bytes > 0);
});

test("create, get, list by label, stop, start, delete", async () => {
  const id = uniqueId("life");
  const label = uniqueId("l");
  cleanup(() => removeSandbox(id));

  const created = await client.createSandbox({
    id,
    start: true,
    env: ["GREETING=hello"],
    labels: { suite: label },
    resources: { memory_mb: 256, pids: 256 },
  });
  assert.equal(created.id, id);
  assert.equal(created.state, "running");
  assert.equal(created.image, "host");
  assert.deepEqual(created.env_keys, ["GREETING"]);
  assert.equal(created.resources.memory_mb, 256);

  const got = await client.getSandbox(id);
  assert.equal(got.state, "running");
  assert.deepEqual(got.labels, { suite: label });

  const listed = await client.listSandboxes({ labels: [`suite=${label}`], state: "running" });
  assert.deepEqual(
    listed.items.map((s) => s.id),
    [id],
  );
  const none = await client.listSandboxes({ labels: [`suite=${label}`], state: "stopped" });
  assert.equal(none.items.length, 0);

  const stopped = await client.stopSandbox(id);
  assert.equal(stopped.state, "stopped");
  assert.equal(stopped.last_exit?.reason, "stopped");

  const started = await client.startSandbox(id);
  assert.equal(started.state, "running");

  const killed = await client.stopSandbox(id, { force: true });
  assert.equal(killed.state, "stopped");
  assert.equal(killed.last_exit?.signal, "SIGKILL");

  await client.deleteSandbox(id);
  await rejectsWithCode(client.getSandbox(id), "sandbox-not-found", 404);
});

test("a created sandbox without start is provisioned, and the server picks an id", async () => {
  const sb = await client.createSandbox();
  cleanup(() => removeSandbox(sb.id));
  assert.ok(sb.id.length > 0);
  assert.equal(sb.state, "provisioned");
  await client.deleteSandbox(sb.id);
  await rejectsWithCode(client.getSandbox(sb.id), "sandbox-not-found", 404);
});

test("logs of a started sandbox are text", async () => {
  const id = uniqueId("logs");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id, start: true });
  const log = await client.logs(id, { tail: 50 });
  assert.equal(typeof log, "string");
});

test("metrics of a running sandbox, and a sleep policy", async () => {
  const id = uniqueId("meter");
  cleanup(() => removeSandbox(id));
  const created = await client.createSandbox({ id, start: true, sleep: { idle_timeout_seconds: 3600 } });
  assert.equal(created.sleep?.idle_timeout_seconds, 3600);
  assert.equal(created.sleep?.auto_resume, true);
  assert.equal(created.asleep, false);
  const m = await client.sandboxMetrics(id);
  assert.equal(m.id, id);
  assert.ok(m.current.memory_bytes > 0 && m.current.pids >= 1, JSON.stringify(m.current));
  assert.ok(m.interval_ms > 0);
});
