// Package events is bothyd's in-process event bus and its server-sent-events endpoint,
// GET /v1/events. It knows nothing of sandboxes or templates beyond the contract's
// [openapi.Event]: cmd/bothyd publishes what the supervisor's OnEvent hook reports, and the
// SSE [Handler] and tests subscribe ([Bus.Subscribe]).
//
// # Ordering and replay
//
// [Bus.Publish] numbers events with a sequence that increases by one per event, and stamps them
// with the time of publication. The sequence survives a restart: with [Options].SeqDir (the
// state root) the bus reserves blocks of numbers in a durable record ([SeqName]) before it
// gives the first of a block, and a new process starts after the last block reserved. Numbers
// of a block a process did not use are skipped, never reused, so a Last-Event-ID from before a
// restart never names a new event, and one durable write serves a block of events. The last events ([Options].History of them,
// [DefaultHistory] by default) are kept in a
// ring, so that a client that reconnects with the standard Last-Event-ID header is first sent
// what it missed, then the live stream, with no gap and no duplicate. An id that the ring no
// longer covers, or one this bus never gave (greater than the current sequence), replays
// the whole ring: the client has missed events and should list what it shows afresh.
//
// # Slow subscribers
//
// Publish never blocks. Each subscriber has a bounded buffer ([DefaultBuffer] events); one that
// falls behind by more than that is dropped: its stream ends, and the client reconnects with
// Last-Event-ID and catches up from the ring. Publishers, among them the supervisor's
// transitions, are thus never slowed down by a stalled browser tab.
package events
