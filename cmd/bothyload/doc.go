// Command bothyload puts a bounded load on a running bothyd over its HTTP API and reports,
// per operation, how many ran, which error codes came back, latency percentiles and
// throughput. It must never run without an end: every run stops after --duration or --cycles,
// and it cleans up the sandboxes and the template it made.
//
// # Mixes
//
// A mix names the kinds of cycle the clients run, with optional weights
// (`--mix lifecycle=1,exec=3`):
//
//   - lifecycle: create, start, exec `true`, stop, delete of a fresh sandbox.
//   - exec: a buffered exec of `true` in one of a few sandboxes started before the load.
//   - stream: a websocket exec of `head -c N /dev/zero` in such a sandbox, read to the end.
//   - clone: clone (create from a template, started), exec `true`, stop, delete; the template
//     is captured before the load from a sandbox holding --clone-size bytes.
//
// Each client draws its next cycle from the mix with its own generator seeded from --seed, so
// a run is reproducible in what it asks for (not in how the server interleaves it).
//
// # Levels of concurrency
//
// --clients takes one number or a list (1,2,4,8,16,32); each level is a phase of its own with
// the same duration or cycle budget, and the report has one table per phase.
//
// # Probes
//
// Before it measures anything, bothyload waits (up to three minutes, saying so) until no
// runtime of the server is still probing (/v1/info): the microvm runtime boots a probe guest
// right after bothyd starts, seconds of both CPUs under emulation, and figures taken beside
// it measure the probe as much as the server.
//
// # Leaks
//
// With --pid, the tool samples the server's resident memory and open file descriptors from
// /proc before the load, during it, and after it (after cleanup, once the idle connections are
// closed), so that a report shows whether they return to their baseline.
//
// # Bench
//
// `bothyload bench` is the benchmark a user can run to reproduce docs/performance.md on
// their own host: twice --cycles sequential full cycles (create with start, exec `true`, forced
// stop, delete), each followed by a bare `bwrap --unshare-all ... true` spawn so that both are
// measured under the same load of the machine, first with ids of their own (every create starts
// a sandbox of its own: the rows "own id"), then with ids the server chooses (a create that
// names nothing, which a server keeping spares answers from one), then websocket streams of
// `head -c --stream-bytes /dev/zero` from a sandbox of each --stream-vcpus. It prints each
// step's median and p90, the median as a multiple of bwrap's, and the verdict against the
// goals of issues 17 and 42 (create+start at most 1.5x bwrap, with the server's id and with
// its own, forced stop 2x, a cycle 3x, streams at least 1 GB/s). With --pid (bothyd's, on the
// same host) it also reports each series' CPU time per cycle, bothyd's and what it reaped
// (the sandboxes' shims and through them everything in them), against the CPU time of the
// series' bwrap spawns; issue 42's goal is 2.5x. With --idle N it then starts N idle
// sandboxes (no disk of their own, 128 MiB limit), reports the host memory they took
// (MemTotal - MemAvailable, so run it on a quiet host) and, with --pid, the PSS of the
// processes below bothyd, a full listing, a page and an exec among them, and deletes them;
// issue 42's goal is 1 MiB of host memory a sandbox (issue 17's was 4). Run it as root beside
// the server, as the bwrap baseline needs namespaces:
//
//	sudo go run ./cmd/bothyload bench --pid "$(pgrep -xo bothyd)"
//	sudo go run ./cmd/bothyload bench --pid "$(pgrep -xo bothyd)" --idle 1000
//
// # Teardown
//
// `bothyload teardown --sandboxes N --clients C` starts N sandboxes (C at a time), then
// stops (forced) and deletes every one of them from C clients, and prints the rate of that
// second phase against issue 17's goal of 100 stop+deletes a second: how fast a host full of
// running sandboxes empties, which depends on how much of the stop path scales with the
// number of sandboxes still running. --disk-mb sets the disk of each sandbox (0: none), so
// that the share of the disk's unmount in a stop shows.
//
// # Authentication
//
// Every mode sends the token of --token-file, else the one bothyd generated into its state
// root (<--root>/token, by default .bothy/token as bothyd's own default), else none.
//
// # Safety
//
// The tool talks to loopback addresses only, unless --allow-remote is given: a load run is not
// something to point at someone else's server by accident.
package main
