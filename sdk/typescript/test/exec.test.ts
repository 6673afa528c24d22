import assert from "node:assert/strict";
import { before, test } from "node:test";

import type { OutputChunk } from "../src/index.js";
import { client, startedSandbox } from "./live.js";

let id = "";
before(async () => {
  id = await startedSandbox("exec");
});

test("buffered exec: output, exit code, stdin, env and cwd", async () => {
  const r = await client.exec(id, {
    command: ["sh", "-c", 'echo "out $GREETING $(pwd)"; echo err >&2; cat; exit 3'],
    env: ["GREETING=hi"],
    cwd: "/tmp",
    stdin: "from stdin\n",
    timeout_ms: 30_000,
  });
  assert.equal(r.exit_code, 3);
  assert.equal(r.stdout, "out hi /tmp\nfrom stdin\n");
  assert.equal(r.stderr, "err\n");
  assert.equal(r.timed_out, false);
  assert.equal(r.stdout_truncated, false);
});

test("buffered exec: a command killed at its deadline says timed_out", async () => {
  const r = await client.exec(id, { command: ["sleep", "30"], timeout_ms: 200 });
  assert.equal(r.timed_out, true);
  assert.equal(r.signal, "SIGKILL");
});

test("streamed exec: stdout and stderr apart, then the exit", async () => {
  const s = await client.execStream(id, ["sh", "-c", "echo out; echo err >&2; exit 7"]);
  const out = await s.collect();
  assert.equal(out.stdout, "out\n");
  assert.equal(out.stderr, "err\n");
  assert.deepEqual(out.exit, { exitCode: 7, signal: null, timedOut: false });
  assert.deepEqual(await s.exit, out.exit);
});

test("streamed exec: output arrives while the command runs, in order", async () => {
  // The command prints a line and then waits for stdin; reading the first chunk before
  // sending anything proves that output streams rather than arriving at the end.
  const s = await client.execStream(id, ["sh", "-c", "echo ready; read x; echo got $x"]);
  const it = s[Symbol.asyncIterator]();
  const first = await it.next();
  assert.equal(first.done, false);
  const chunk: OutputChunk = first.value;
  assert.equal(chunk.stream, "stdout");
  assert.equal(new TextDecoder().decode(chunk.data), "ready\n");
  s.sendStdin("ping\n");
  let rest = "";
  for (let r = await it.next(); r.done !== true; r = await it.next()) rest += new TextDecoder().decode(r.value.data);
  assert.equal(rest, "got ping\n");
  assert.equal((await s.exit).exitCode, 0);
});

test("streamed exec: stdin in pieces, then eof", async () => {
  const s = await client.execStream(id, ["sh", "-c", "wc -c; cat >/dev/null"]);
  s.sendStdin("abc");
  s.sendStdin(new Uint8Array([0x64, 0x65, 0x0a]));
  s.closeStdin();
  const out = await s.collect();
  assert.equal(out.stdout.trim(), "6");
  assert.equal(out.exit.exitCode, 0);
});

test("streamed exec: a terminal, resized before input", async () => {
  const s = await client.execStream(id, ["sh", "-c", "read x; stty size"], { tty: true, rows: 24, cols: 80 });
  s.resize(40, 100);
  s.sendStdin("\n");
  const out = await s.collect();
  assert.match(out.stdout, /40 100/);
  assert.equal(out.stderr, "", "a terminal sends everything on stdout");
  assert.equal(out.exit.exitCode, 0);
});

test("streamed exec: kill sends a signal, and the exit names it", async () => {
  const s = await client.execStream(id, ["sh", "-c", "echo started; exec sleep 60"]);
  const it = s[Symbol.asyncIterator]();
  await it.next(); // "started": the command runs
  s.kill("SIGTERM");
  const exit = await s.exit;
  assert.equal(exit.signal, "SIGTERM");
  assert.notEqual(exit.exitCode, 0);
  assert.equal(exit.timedOut, false);
});

test("streamed exec: a command past its timeout_ms is killed with timedOut", async () => {
  const s = await client.execStream(id, ["sleep", "30"], { timeoutMs: 200 });
  const exit = await s.exit;
  assert.equal(exit.timedOut, true);
  assert.equal(exit.signal, "SIGKILL");
});

test("streamed exec: binary output arrives byte for byte", async () => {
  const s = await client.execStream(id, ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' '\\377'"]);
  let n = 0;
  let allFF = true;
  for await (const c of s) {
    assert.equal(c.stream, "stdout");
    n += c.data.length;
    if (allFF && c.data.some((b) => b !== 0xff)) allFF = false;
  }
  assert.equal(n, 3_000_000);
  assert.ok(allFF, "every byte is 0xff");
  assert.equal((await s.exit).exitCode, 0);
});
