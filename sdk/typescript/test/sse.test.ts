// The server-sent events parser and the event validation, on fixed input (no server).
import assert from "node:assert/strict";
import { test } from "node:test";

import { parseEvent, parseServerSentEvents, type ServerSentEvent } from "../src/index.js";

function streamOf(...parts: string[]): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  return new ReadableStream<Uint8Array>({
    start(c) {
      for (const p of parts) c.enqueue(enc.encode(p));
      c.close();
    },
  });
}

async function collect(body: ReadableStream<Uint8Array>): Promise<ServerSentEvent[]> {
  const out: ServerSentEvent[] = [];
  for await (const e of parseServerSentEvents(body)) out.push(e);
  return out;
}

test("events split across reads, comments, CRLF and multi-line data", async () => {
  const got = await collect(
    streamOf("retry: 2000\n: connected\n\nid: 1\nev", "ent: sandbox.created\ndata: {\"a\":", "1}\n\n", ": ping\r\n\r\n", "id: 2\r\ndata: x\r\ndata: y\r\n\r\n", "data: unterminated"),
  );
  assert.deepEqual(got, [
    { id: "1", event: "sandbox.created", data: '{"a":1}' },
    { id: "2", event: "message", data: "x\ny" },
  ]);
});

test("parseEvent keeps the known fields and refuses what is not an event", () => {
  const e = parseEvent(
    '{"seq":7,"type":"sandbox.exited","at":"2026-11-30T15:04:05Z","sandbox":"b","state":"stopped","exit":{"code":1,"at":"2026-11-30T15:04:05Z","reason":"exited"},"extra":true}',
  );
  assert.deepEqual(e, {
    seq: 7,
    type: "sandbox.exited",
    at: "2026-11-30T15:04:05Z",
    sandbox: "b",
    state: "stopped",
    exit: { code: 1, at: "2026-11-30T15:04:05Z", reason: "exited" },
  });
  assert.equal(parseEvent('{"seq":1,"type":"something.new","at":"x"}'), undefined);
  assert.equal(parseEvent("not json"), undefined);
  assert.equal(parseEvent('{"type":"sandbox.created","at":"x"}'), undefined);
});
