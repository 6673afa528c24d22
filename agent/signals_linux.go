package agent

import (
	"log/slog"
	"os"
	"os/signal"
	"strings"

	"golang.org/x/sys/unix"
)

// sigRTMax is the highest signal number on Linux.
const sigRTMax = 64

// leftToRuntime are the catchable signals the agent does not take from the Go runtime:
// TERM and INT are Run's shutdown (the shim forwards its own TERM, INT and HUP as TERM),
// CHLD is the reaper's, URG is the runtime's goroutine preemption and PROF its profiler, PIPE
// keeps the runtime's convention for a broken standard output (a PIPE sent by kill is
// already ignored by the runtime), and 32 to 34 are the C libraries' thread signals (glibc's
// SIGCANCEL and SIGSETXID, musl's SIGSYNCCALL), which the runtime does not let os/signal
// take. KILL and STOP cannot be caught. To a pid namespace's init the kernel delivers no
// signal from inside the namespace that it has no handler for: KILL, STOP, and 32 to 34
// where no C library handles them, are dropped, so they cannot reach the agent as PID 1.
var leftToRuntime = map[unix.Signal]bool{
	unix.SIGKILL: true, unix.SIGSTOP: true,
	unix.SIGTERM: true, unix.SIGINT: true,
	unix.SIGCHLD: true, unix.SIGURG: true, unix.SIGPROF: true, unix.SIGPIPE: true,
	32: true, 33: true, 34: true,
}

// ignoredSignals lists every other signal: those the agent takes so that nobody can end or
// stop it with them.
func ignoredSignals() []os.Signal {
	var out []os.Signal
	for n := 1; n <= sigRTMax; n++ {
		if sig := unix.Signal(n); !leftToRuntime[sig] {
			out = append(out, sig)
		}
	}
	return out
}

// PrepareSignals does ahead what Run's catching of the ignored signals costs most: the Go
// runtime enables each signal by a round trip to a thread of its own (about 60 of them, a
// few milliseconds in all here), once per process. A caller that waits for something before
// it runs the agent, as the sandbox's init waits for its mounts, calls it in a goroutine
// meanwhile; Run then finds the signals enabled. Until Run, they are caught and dropped: none
// of them is one that bothyd or the shim sends (TERM and KILL are left as they were).
func PrepareSignals() {
	signal.Notify(make(chan os.Signal, 1), ignoredSignals()...)
}

// ignoreSignals keeps every signal but those of leftToRuntime from ending, stopping or
// dumping the agent, and returns a function that undoes it.
//
// The agent is the sandbox's PID 1, and root inside the sandbox may signal it. Left to the Go
// runtime, QUIT and ABRT dump every goroutine's stack into the sandbox's log and exit; SEGV,
// BUS, FPE, ILL, TRAP and SYS sent with kill crash it the same way; HUP ends it; TSTP, TTIN and
// TTOU would stop it were it not PID 1. All of that would end the sandbox at its workload's
// whim and fill the log. Catching them with os/signal (not ignoring them with signal.Ignore,
// whose SIG_IGN workloads would inherit across exec) leaves the runtime's handling of real
// faults alone: a SEGV the kernel raises for a bad access still panics, only one sent by a
// process is taken. The first of each kind is logged, the rest are dropped quietly so that a
// loop of kill cannot flood the log.
func ignoreSignals(log *slog.Logger) (stop func()) {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, ignoredSignals()...)
	done := make(chan struct{})
	go func() {
		seen := map[os.Signal]bool{}
		for {
			select {
			case sig := <-ch:
				if !seen[sig] {
					seen[sig] = true
					name := strings.TrimPrefix(unix.SignalName(sig.(unix.Signal)), "SIG")
					if name == "" {
						name = sig.String() // a real-time signal
					}
					log.Warn("agent ignored a signal sent to it; further ones of this kind are not logged", "signal", name)
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
