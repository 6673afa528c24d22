//go:build linux

package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// A shim whose sandbox runs on sheds its set-up: once the sandbox has run for shedAfter, the
// shim replaces itself (execve of its own binary, same pid, same argv, same start time) by a
// fresh process that only waits for the init and reports its end. What the set-up left in the
// Go runtime (a heap that grew for the configuration and the mounts, the threads that its
// blocking calls made, their stacks) goes with the old image: the waiter holds about 0.6 MiB
// less, a sixth of what an idle sandbox costs the host (docs/performance.md). A sandbox that
// ends sooner never pays for the second start, about 8 ms of CPU here, which is why the shim
// waits shedAfter first.
//
// What the waiter needs comes along: its process (it is still the init's parent, and the
// init's parent-death signal watches the main thread, which makes the exec and lives on), the
// lifeline, the id range's lock and what the launch holds for its release (their descriptors
// are kept open across the exec), the shim's log (stderr), and a [waitState] in the
// environment.
//
// A TERM, INT or HUP for the shim is passed on to the sandbox up to the exec, and by the
// waiter from its first moments. One that comes in between (the exec and the start of a Go
// program, about a millisecond) is lost or ends the waiter, and the init with it, as one in
// the first moments of any shim's start would: the supervisor then finds a shim that ended
// without an outcome and cleans up (Runtime.Cleanup). bothyd never signals a shim; an
// operator or a service manager does, and a service manager escalates to KILL.
// (Blocking the signals across the exec cannot close the gap: Go changes another thread's mask
// only from a signal handler, whose return restores it, and a new Go program unblocks TERM
// before its main runs, taking a pending one as its own death.)

// shedAfter is how long a sandbox runs before its shim sheds its set-up.
const shedAfter = 10 * time.Second

// waitStateEnv names the environment variable that carries a [waitState] to the waiter.
const waitStateEnv = "BOTHY_SHIM_WAITING"

// forwardedSignals are the signals the shim passes to its sandbox as a request to shut down.
var forwardedSignals = []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}

// waitState is what a waiting shim needs to see its sandbox to the end.
type waitState struct {
	Dir      string `json:"dir"`
	LaunchID string `json:"launch_id"`
	Cgroup   string `json:"cgroup"`
	InitPID  int    `json:"init_pid"`
	// RootFD and DiskLockFD are the descriptors of what the launch holds for its release
	// (release_linux.go), kept across the exec; 0 for none.
	RootFD     int `json:"root_fd,omitempty"`
	DiskLockFD int `json:"disk_lock_fd,omitempty"`
	// ReleaseSocket is [Config.ReleaseSocket].
	ReleaseSocket string `json:"release_socket,omitempty"`
}

// settled waits for the init to end within d without reaping it, and reports whether it is
// still running.
func (p *initProcess) settled(d time.Duration) bool {
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		var info unix.Siginfo
		_ = platform.IgnoringEINTR(func() error {
			return unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		})
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ended:
		return false
	case <-t.C:
		return true
	}
}

// shed replaces the shim by a waiter (see above). It returns only if it could not, with
// forwarding running again.
func (p *initProcess) shed(fw *forwarder, ws waitState) error {
	ws.RootFD, ws.DiskLockFD = p.held.fds()
	b, err := json.Marshal(ws)
	if err != nil {
		return err
	}
	// One P: the waiter only waits, and fewer Ps start fewer threads, each with its stacks.
	env := []string{waitStateEnv + "=" + string(b), "GOMAXPROCS=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, waitStateEnv+"=") && !strings.HasPrefix(kv, "GOMAXPROCS=") {
			env = append(env, kv)
		}
	}
	if err := p.keepOnExec(true); err != nil {
		return err
	}
	defer p.keepOnExec(false) //nolint:errcheck // the shim lives on with them either way
	fw.stop()
	defer fw.start()
	// What came before the exec goes to the sandbox now; what comes during it, the waiter
	// takes once it asks for the signals, first thing.
	fw.drain()
	err = syscall.Exec("/proc/self/exe", os.Args, env) //nolint:gosec // its own binary and argv: what identifies a shim
	return fmt.Errorf("exec: %w", err)
}

// keepOnExec keeps the lifeline, the id range's lock and what the launch holds for its
// release open across an exec, or no longer.
func (p *initProcess) keepOnExec(keep bool) error {
	if err := platform.SetCloseOnExec(p.lifeline, !keep); err != nil {
		return err
	}
	if err := p.held.keepOnExec(keep); err != nil {
		return err
	}
	if p.ids != nil {
		return p.ids.lock.KeepOnExec(keep)
	}
	return nil
}

// waitMain is the shim after it shed its set-up: it waits for the init, passing on the
// signals that ask the sandbox to shut down, and reports how it ended, as the shim would have.
func waitMain(ws *waitState) int {
	// First thing: a signal for the shim is the sandbox's again (kept until forwarding starts).
	fw := newForwarder(nil)
	logf("shed its set-up: now only waits for the init (pid %d)", ws.InitPID)
	l := &launch{dir: ws.Dir, releaseSocket: ws.ReleaseSocket, outcome: runtime.Outcome{LaunchID: ws.LaunchID}, held: heldFrom(ws.RootFD, ws.DiskLockFD)}
	cg, err := platform.OpenCgroup(ws.Cgroup)
	if err != nil {
		logf("the sandbox's cgroup: %v", err)
		cg = nil
	}
	// A pidfd of the child, not reaped yet, names it alone, so no signal forwarded late can
	// reach a process that takes its pid after the reap.
	fw.send = func() error { return unix.Kill(ws.InitPID, unix.SIGTERM) }
	if pidfd, err := unix.PidfdOpen(ws.InitPID, 0); err == nil {
		fw.send = func() error { return unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0) }
	} else {
		logf("a pidfd of the init (pid %d): %v; signals go by its pid", ws.InitPID, err)
	}
	fw.start()
	var status unix.WaitStatus
	err = platform.IgnoringEINTR(func() error {
		_, err := unix.Wait4(ws.InitPID, &status, 0, nil)
		return err
	})
	fw.stop()
	if err != nil {
		return l.fail(cg, "wait for the init: %v", err)
	}
	l.recordEnd(syscall.WaitStatus(status), cg)
	return l.finish(cg)
}

// forwarder passes the signals for the shim on to the sandbox (send), from a goroutine that
// stop ends.
type forwarder struct {
	send func() error
	sigc chan os.Signal
	quit chan struct{}
	done chan struct{}
}

func newForwarder(send func() error) *forwarder {
	fw := &forwarder{send: send, sigc: make(chan os.Signal, len(forwardedSignals))}
	signal.Notify(fw.sigc, forwardedSignals[0], forwardedSignals[1], forwardedSignals[2])
	return fw
}

func (fw *forwarder) start() {
	fw.quit, fw.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(fw.done)
		for {
			select {
			case sig := <-fw.sigc:
				fw.forward(sig)
			case <-fw.quit:
				return
			}
		}
	}()
}

// stop ends the forwarding goroutine once it passed on what it took.
func (fw *forwarder) stop() {
	close(fw.quit)
	<-fw.done
}

// drain passes on the signals that arrived and were not taken.
func (fw *forwarder) drain() {
	for {
		select {
		case sig := <-fw.sigc:
			fw.forward(sig)
		default:
			return
		}
	}
}

func (fw *forwarder) forward(sig os.Signal) {
	logf("forwarding %v to the sandbox", sig)
	if err := fw.send(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		logf("forwarding %v: %v", sig, err)
	}
}
