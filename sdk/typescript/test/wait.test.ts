import assert from "node:assert/strict";
import { test } from "node:test";

import { WaitTimeoutError, type Event } from "../src/index.js";
import { client, cleanup, rejectsWithCode, removeSandbox, uniqueId } from "./live.js";

test("waitForState sees a start and a stop that happen while it waits", async () => {
  const id = uniqueId("wait");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id });

  const running = client.waitForState(id, "running", { timeoutMs: 60_000 });
  await client.startSandbox(id);
  assert.equal((await running).state, "running");

  const stopped = client.waitForState(id, ["stopped", "provisioned"], { timeoutMs: 60_000 });
  await client.stopSandbox(id);
  const sb = await stopped;
  assert.equal(sb.state, "stopped");
  assert.equal(sb.last_exit?.reason, "stopped");
});

test("waitForState answers at once for a sandbox already in the state", async () => {
  const id = uniqueId("wait");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id });
  assert.equal((await client.waitForState(id, "provisioned")).id, id);
});

test("waitForState gives up with WaitTimeoutError naming the state", async () => {
  const id = uniqueId("wait");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id });
  await assert.rejects(client.waitForState(id, "running", { timeoutMs: 300 }), (err: unknown) => {
    assert.ok(err instanceof WaitTimeoutError, `want a WaitTimeoutError, got ${String(err)}`);
    assert.equal(err.lastState, "provisioned");
    return true;
  });
});

test("waitForState on a sandbox deleted meanwhile is sandbox-not-found", async () => {
  const id = uniqueId("wait");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id });
  // The deletion may reach the wait as its event or as the first read finding the sandbox
  // gone; both are sandbox-not-found. The assertion is attached before the deletion, so that
  // an early rejection is never unhandled.
  const waiting = rejectsWithCode(client.waitForState(id, "running", { timeoutMs: 60_000 }), "sandbox-not-found", 404);
  await client.deleteSandbox(id);
  await waiting;
  await rejectsWithCode(client.waitForState(id, "running"), "sandbox-not-found", 404);
});

test("waitForState honours an abort signal", async () => {
  const id = uniqueId("wait");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id });
  const ac = new AbortController();
  const waiting = client.waitForState(id, "running", { signal: ac.signal });
  ac.abort(new Error("caller gave up"));
  await assert.rejects(waiting, /caller gave up/);
});

test("subscribe delivers the lifecycle events of a sandbox, in order", async () => {
  const id = uniqueId("events");
  cleanup(() => removeSandbox(id));
  const sub = await client.subscribe();
  const seen: Event[] = [];
  const done = (async () => {
    for await (const e of sub) {
      if (e.sandbox !== id) continue;
      seen.push(e);
      if (e.type === "sandbox.deleted") break;
    }
  })();
  await client.createSandbox({ id, start: true });
  await client.stopSandbox(id);
  await client.deleteSandbox(id);
  await done;
  sub.close();
  assert.deepEqual(
    seen.map((e) => e.type),
    ["sandbox.created", "sandbox.started", "sandbox.stopped", "sandbox.deleted"],
  );
  assert.equal(seen[1]?.state, "running");
  for (let i = 1; i < seen.length; i++) {
    const prev = seen[i - 1];
    const cur = seen[i];
    assert.ok(prev !== undefined && cur !== undefined && cur.seq > prev.seq, "seq increases");
  }
});
