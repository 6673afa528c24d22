// The event stream, GET /v1/events (server-sent events), read over fetch: a parser of the
// text/event-stream format and the validation of each event's data into an Event.

import { knownEventTypes } from "./codes.gen.js";
import { eventProgressPhaseValues, lastExitReasonValues, sandboxStateValues } from "./schema.gen.js";
import { isRecord, numberField, oneOf, parseJSON, stringField } from "./guards.js";
import type { Event, LastExit } from "./types.js";

/** One dispatched server-sent event. */
export interface ServerSentEvent {
  id: string | undefined;
  event: string;
  data: string;
}

/**
 * The events of a text/event-stream body, as the HTML standard's parser dispatches them:
 * fields up to a blank line, comment lines (": ping") ignored, data lines joined by "\n".
 */
export async function* parseServerSentEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<ServerSentEvent> {
  const decoder = new TextDecoder();
  let buffer = "";
  let id: string | undefined;
  let event = "";
  let data: string[] = [];
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      for (;;) {
        const nl = buffer.search(/\r\n|\r|\n/);
        if (nl < 0) break;
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
        if (line === "") {
          if (data.length > 0) yield { id, event: event === "" ? "message" : event, data: data.join("\n") };
          event = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") data.push(value);
        else if (field === "event") event = value;
        else if (field === "id" && !value.includes("\0")) id = value;
      }
      if (done) return;
    }
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}

function parseLastExit(v: unknown): LastExit | undefined {
  if (!isRecord(v)) return undefined;
  const at = stringField(v, "at");
  const reason = oneOf(lastExitReasonValues, v["reason"]);
  if (at === undefined || reason === undefined) return undefined;
  const e: LastExit = { at, reason };
  const code = numberField(v, "code");
  if (code !== undefined) e.code = code;
  const signal = stringField(v, "signal");
  if (signal !== undefined) e.signal = signal;
  return e;
}

/**
 * The Event in an SSE data field, or undefined when it is not one (for example a type this
 * SDK does not know, which the contract tells clients to ignore).
 */
export function parseEvent(data: string): Event | undefined {
  const v = parseJSON(data);
  if (!isRecord(v)) return undefined;
  const seq = numberField(v, "seq");
  const type = oneOf(knownEventTypes, v["type"]);
  const at = stringField(v, "at");
  if (seq === undefined || type === undefined || at === undefined) return undefined;
  const e: Event = { seq, type, at };
  const sandbox = stringField(v, "sandbox");
  if (sandbox !== undefined) e.sandbox = sandbox;
  const state = oneOf(sandboxStateValues, v["state"]);
  if (state !== undefined) e.state = state;
  const exit = parseLastExit(v["exit"]);
  if (exit !== undefined) e.exit = exit;
  const template = stringField(v, "template");
  if (template !== undefined) e.template = template;
  const generation = stringField(v, "generation");
  if (generation !== undefined) e.generation = generation;
  const lease = stringField(v, "lease");
  if (lease !== undefined) e.lease = lease;
  const progress = v["progress"];
  if (isRecord(progress)) {
    const phase = oneOf(eventProgressPhaseValues, progress["phase"]);
    const done = numberField(progress, "bytes_done");
    if (phase !== undefined && done !== undefined) {
      const total = numberField(progress, "bytes_total");
      e.progress = total === undefined ? { phase, bytes_done: done } : { phase, bytes_done: done, bytes_total: total };
    }
  }
  return e;
}
