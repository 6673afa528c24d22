import assert from "node:assert/strict";
import { test } from "node:test";

import { ConnectionError, Bothy, BothyError, isBothyError } from "../src/index.js";
import { baseUrl, client, cleanup, rejectsWithCode, removeSandbox, startedSandbox, token, uniqueId } from "./live.js";

test("a missing sandbox is sandbox-not-found, with a detail and a request id", async () => {
  const err = await rejectsWithCode(client.getSandbox(uniqueId("missing")), "sandbox-not-found", 404);
  assert.ok(err.requestId !== undefined && err.requestId.length > 0);
  assert.ok(isBothyError(err, "sandbox-not-found"));
  assert.equal(isBothyError(err, "sandbox-busy"), false);
  assert.equal(err.toProblem().code, "sandbox-not-found");
});

test("a malformed id is invalid-request naming the field", async () => {
  const err = await rejectsWithCode(client.createSandbox({ id: "Not_Valid" }), "invalid-request", 400);
  assert.ok(err.field !== undefined);
});

test("a taken id is already-provisioned", async () => {
  const id = uniqueId("dup");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id });
  await rejectsWithCode(client.createSandbox({ id }), "already-provisioned", 409);
});

test("lifecycle conflicts: not-running, already-running, sandbox-launched", async () => {
  const id = uniqueId("conflict");
  cleanup(() => removeSandbox(id));
  await client.createSandbox({ id });
  await rejectsWithCode(client.exec(id, { command: ["true"] }), "not-running", 409);
  await rejectsWithCode(client.execStream(id, ["true"]), "not-running", 409);
  await rejectsWithCode(client.stopSandbox(id), "not-running", 409);
  await client.startSandbox(id);
  await rejectsWithCode(client.startSandbox(id), "already-running", 409);
  await rejectsWithCode(client.deleteSandbox(id), "sandbox-launched", 409);
});

test("a second exec while one runs is sandbox-busy after wait_ms", async () => {
  const id = await startedSandbox("busy");
  const s = await client.execStream(id, ["sh", "-c", "echo holding; exec sleep 60"]);
  const it = s[Symbol.asyncIterator]();
  await it.next(); // the first exec holds the sandbox
  await rejectsWithCode(client.exec(id, { command: ["true"], wait_ms: 100 }), "sandbox-busy", 423);
  await rejectsWithCode(client.execStream(id, ["true"], { waitMs: 100 }), "sandbox-busy", 423);
  s.kill();
  assert.equal((await s.exit).signal, "SIGKILL");
});

test("a wrong token is unauthorized, when the server has a token", { skip: token === undefined }, async () => {
  const wrong = new Bothy({ baseUrl, token: "wrong-token-0123456789abcdef" });
  await rejectsWithCode(wrong.listSandboxes(), "unauthorized", 401);
  await rejectsWithCode(wrong.execStream("any", ["true"]), "unauthorized", 401);
  await rejectsWithCode(wrong.subscribe(), "unauthorized", 401);
  const none = new Bothy({ baseUrl });
  await rejectsWithCode(none.getSandbox("any"), "unauthorized", 401);
});

test("a server that is not there is a ConnectionError, not a BothyError", async () => {
  // Port 1 on loopback: nothing listens there without root's explicit doing.
  const gone = new Bothy({ baseUrl: "http://127.0.0.1:1" });
  await assert.rejects(gone.listSandboxes(), (err: unknown) => {
    assert.ok(err instanceof ConnectionError, `want a ConnectionError, got ${String(err)}`);
    assert.ok(!(err instanceof BothyError));
    assert.match(err.message, /is it running/);
    return true;
  });
  await assert.rejects(gone.execStream("x", ["true"]), (err: unknown) => err instanceof ConnectionError);
  await assert.rejects(gone.readFile("x", "/tmp"), (err: unknown) => err instanceof ConnectionError);
});
