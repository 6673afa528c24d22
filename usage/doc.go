// Package usage samples what running sandboxes use: CPU time and rate, memory (now, peak,
// limit), tasks, the disk of their own and their network bytes. It keeps, per sandbox, the
// last samples taken at a fixed interval, bounded in number and in the sandboxes it keeps
// them for, for GET /v1/sandboxes/{id}/metrics, E2B's getMetrics and the labelled series of
// /metrics. It only reads: the readings come from the supervisor (the runtime's cgroup, see
// runtime.Meter) and the network manager (the veth's counters), and nothing here drives a
// sandbox.
//
// # Bounds
//
// History is kept for at most [Config.MaxSandboxes] sandboxes, [Config.Keep] samples each; a
// sandbox beyond the cap is still answered its current reading, with no history. A sandbox
// that no longer runs loses its history at the next tick. The CPU rate is the CPU time used
// between two readings over the wall time between them, in CPUs (1.0: one CPU busy).
package usage
