// bothyd's TypeScript SDK. The types and the raw client are generated from
// openapi/openapi.yaml (schema.gen.ts, by openapi-typescript; the client by openapi-fetch);
// the rest is a small hand-written layer for what a generator does not do well.

export { Bothy, WaitTimeoutError } from "./client.js";
export type {
  EventSubscription,
  FileBody,
  Retirement,
  BothyOptions,
  SubscribeOptions,
  TransitionOptions,
  WaitOptions,
} from "./client.js";
export { ConnectionError, BothyError, isBothyError } from "./errors.js";
export { ExecStream } from "./exec.js";
export type { CollectedOutput, ExecExit, ExecStreamOptions, OutputChunk } from "./exec.js";
export { parseEvent, parseServerSentEvents } from "./events.js";
export type { ServerSentEvent } from "./events.js";
export type * from "./types.js";
export type { components, operations, paths } from "./schema.gen.js";
export { sandboxStateValues } from "./schema.gen.js";
// eventTypeValues is the name the list had while the spec's event types were a closed enum.
export { knownErrorCodes, knownEventTypes, knownEventTypes as eventTypeValues } from "./codes.gen.js";
