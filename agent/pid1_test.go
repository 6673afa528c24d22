package agent

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
)

// The PID 1 test runs the agent the way a sandbox does: as init of a new pid namespace, with
// its own /proc, so that kill(-1), reaping every orphan and the stats of the whole namespace
// are exercised for real.

const pid1Env = "BOTHY_AGENT_PID1_SOCKET"

func TestPID1Helper(t *testing.T) {
	sock := os.Getenv(pid1Env)
	if sock == "" {
		t.Skip("helper process for TestAsPID1")
	}
	if os.Getpid() != 1 {
		t.Fatalf("helper is pid %d, not 1", os.Getpid())
	}
	// A private mount namespace with a /proc of this pid namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatal(err)
	}
	err := RunContext(context.Background(), Config{
		ListenPath: sock,
		Capability: testCapability,
		Users:      map[string]UserSpec{"user": {UID: 1000, GID: 1000, Home: "/tmp"}},
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAsPID1(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root to create a pid namespace")
	}
	t.Parallel()
	// No Pdeathsig: it fires when the forking OS thread ends, and the agent's file
	// operations end threads on purpose.
	c, cmd := startHelperAgent(t, "TestPID1Helper", pid1Env, &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNS})
	ctx := context.Background()

	// Orphans are reaped: five subshells leave their sleeps to PID 1.
	_, _, st := run(t, c, control.ExecRequest{Argv: []string{"sh", "-c", "for i in 1 2 3 4 5; do (sleep 0.5 &); done; exit 7"}}, "")
	if st.ExitCode != 7 {
		t.Fatalf("status %+v", st)
	}
	waitFor(t, "the orphans to come and go", 20*time.Second, func() bool {
		s, err := c.Stats(ctx)
		return err == nil && s.Pids == 1 // the agent alone
	})

	// A process that ignores TERM, detached into its own session so that only kill(-1)
	// reaches it, survives the grace and dies by KILL.
	if _, _, st := run(t, c, control.ExecRequest{Argv: []string{"sh", "-c", `setsid sh -c 'trap "" TERM; sleep 100' </dev/null >/dev/null 2>&1 &`}}, ""); st.ExitCode != 0 {
		t.Fatalf("detach: %+v", st)
	}
	p, err := c.Exec(ctx, control.ExecRequest{Argv: []string{"sh", "-c", "echo ready; sleep 100"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(p.Stdout).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the detached process", 10*time.Second, func() bool {
		s, err := c.Stats(ctx)
		return err == nil && s.Pids >= 4 // agent, sh, sleep, the detached sh and its sleep
	})
	go io.Copy(io.Discard, p.Stdout)
	go io.Copy(io.Discard, p.Stderr)
	if err := c.Shutdown(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(); err != nil || st.Signal != "TERM" {
		t.Fatalf("workload: %+v %v", st, err)
	}
	// The agent exits after a shutdown, which ends the namespace.
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent: %v", err)
	}
}
