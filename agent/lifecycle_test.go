package agent

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
)

func TestShutdown(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	polite, err := c.Exec(ctx, control.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	// Ignoring TERM is inherited by the sleep: only KILL ends this one.
	stubborn, err := c.Exec(ctx, control.ExecRequest{Argv: []string{"sh", "-c", `trap "" TERM; echo ready; sleep 100`}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stubborn.Stdout).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	type result struct {
		st  control.ExitStatus
		err error
	}
	wait := func(p *control.Process) <-chan result {
		ch := make(chan result, 1)
		go func() {
			go io.Copy(io.Discard, p.Stderr)
			io.Copy(io.Discard, p.Stdout)
			st, err := p.Wait()
			ch <- result{st, err}
		}()
		return ch
	}
	politeDone, stubbornDone := wait(polite), wait(stubborn)

	if err := c.Shutdown(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if r := <-politeDone; r.err != nil || r.st.Signal != "TERM" {
		t.Fatalf("polite workload: %+v %v", r.st, r.err)
	}
	if r := <-stubbornDone; r.err != nil || r.st.Signal != "KILL" {
		t.Fatalf("stubborn workload: %+v %v", r.st, r.err)
	}
	if err := ta.wait(t); err != nil {
		t.Fatalf("RunContext after shutdown: %v", err)
	}
	if alive(polite.PID) || alive(stubborn.PID) {
		t.Fatal("a workload survived the shutdown")
	}
}

// TestCancelTerminates: the agent's own stop (a signal to Run; the context here) ends the
// workloads too.
func TestCancelTerminates(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	p, err := c.Exec(context.Background(), control.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	ta.cancel()
	if err := ta.wait(t); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the workload to end", 10*time.Second, func() bool { return !alive(p.PID) })
}

func TestStats(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	p, err := c.Exec(context.Background(), control.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 & sleep 100"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The background sleep may not have forked yet: wait for the count (the condition).
	var st control.Stats
	waitFor(t, "two processes in stats", 10*time.Second, func() bool {
		st, err = c.Stats(context.Background())
		return err == nil && st.Pids >= 3
	})
	if st.MemoryBytes == 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestHelloRefusesWrongCapability checks the real agent over its socket.
func TestHelloRefusesWrongCapability(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	conn, err := net.Dial("unix", ta.sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := control.Dial(conn, []byte("not the capability"), 5*time.Second); err == nil {
		t.Fatal("dial with a wrong capability succeeded")
	}
	// The agent still serves the right one.
	c := ta.dial(t)
	if len(c.Features()) == 0 {
		t.Fatal("no features")
	}
}

// The subreaper test: the orphans of a workload reparent to the agent only when it is PID 1 or
// a child subreaper, so a re-executed test binary plays that part.

const helperEnv = "BOTHY_AGENT_SUBREAPER_SOCKET"

func TestSubreaperHelper(t *testing.T) {
	sock := os.Getenv(helperEnv)
	if sock == "" {
		t.Skip("helper process for TestReapsOrphans")
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	err := RunContext(context.Background(), Config{
		ListenPath: sock,
		Capability: testCapability,
		Users:      map[string]UserSpec{"user": {UID: 1000, GID: 1000, Home: "/tmp"}},
		ReapAll:    true,
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestReapsOrphans(t *testing.T) {
	t.Parallel()
	c, cmd := startHelperAgent(t, "TestSubreaperHelper", helperEnv, nil)

	// Each subshell exits at once, so its sleep is orphaned to the helper and dies there a
	// moment later; the workload's own status must still reach its exec.
	_, _, st := run(t, c, control.ExecRequest{Argv: []string{"sh", "-c", "for i in 1 2 3 4 5; do (sleep 1 &); done; exit 7"}}, "")
	if st.ExitCode != 7 {
		t.Fatalf("status %+v, want exit 7", st)
	}
	helper := cmd.Process.Pid
	orphans := func() (n, zombies int) {
		for _, p := range processes() {
			if p.ppid == helper {
				n++
				if p.state == 'Z' {
					zombies++
				}
			}
		}
		return
	}
	// The orphans must have been re-parented to the helper (they live for a second)...
	waitFor(t, "the orphans to re-parent", 10*time.Second, func() bool {
		n, _ := orphans()
		return n == 5
	})
	// ...and must all be reaped, not linger as zombies.
	waitFor(t, "the orphans to be reaped", 20*time.Second, func() bool {
		n, _ := orphans()
		return n == 0
	})
	if err := c.Shutdown(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
}
