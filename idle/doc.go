// Package idle keeps the clock of sandboxes that may sleep: when each was last used through
// the API (an exec, a stream, a file call, a port connection, a wake), which of those are
// still in flight, and whether the work inside used CPU, and it puts to sleep (pauses) a
// sandbox idle for longer than its own idle timeout. It decides and keeps time only: the
// pause, the wake and the records are the supervisor's, reached through [WatchConfig].
//
// # Idle
//
// A sandbox is idle when nothing is in flight ([Tracker.Begin] without its end: an exec, a
// stream, a port connection) and nothing touched it ([Tracker.Touch]) for its timeout. Work
// running inside keeps it awake too, unless its policy ignores work: a sandbox whose
// processes used more than [BusyShare] of a CPU between two ticks counts as used at that
// tick.
//
// # Across restarts
//
// The last use is recorded durably ([WatchConfig.Persist]) when it moved by a quarter of the
// timeout since the last record, so a busy sandbox costs a durable write a quarter-timeout,
// not one a request. A restarted server takes the record plus that quarter as the last use
// ([WatchConfig.Load]): the timer runs on across the restart and never ends early, at most a
// quarter late. A sandbox asleep stays asleep: its pause is the supervisor's durable record.
package idle
