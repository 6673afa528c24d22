package agent

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
)

var testCapability = []byte("0123456789abcdef0123456789abcdef")

type testAgent struct {
	sock   string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // RunContext's result, once done is closed
}

// wait waits for RunContext to return and gives its result.
func (ta *testAgent) wait(t testing.TB) error {
	t.Helper()
	select {
	case <-ta.done:
		return ta.err
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not stop")
		return nil
	}
}

// startAgent runs an agent on a socket in a temporary directory. As root, "user" is uid 1000
// with /tmp as home, so tests exercise the real credential switch; otherwise the agent runs
// everything as the test's user.
func startAgent(t testing.TB, mod ...func(*Config)) *testAgent {
	t.Helper()
	dir, err := os.MkdirTemp("", "agt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := Config{
		ListenPath: filepath.Join(dir, "run", "control.sock"),
		Capability: testCapability,
		Users: map[string]UserSpec{
			"user": {UID: 1000, GID: 1000, Home: "/tmp"},
			"root": {UID: 0, GID: 0, Home: "/"},
		},
		ShutdownGrace: 2 * time.Second,
		Logger:        slog.New(slog.DiscardHandler),
	}
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{sock: cfg.ListenPath, cancel: cancel, done: make(chan struct{})}
	go func() {
		ta.err = RunContext(ctx, cfg)
		close(ta.done)
	}()
	t.Cleanup(func() {
		cancel()
		ta.wait(t)
	})
	// Wait for the socket to appear (the condition), with a deadline.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Stat(cfg.ListenPath); err == nil && fi.Mode().Type() == os.ModeSocket {
			break
		}
		select {
		case <-ta.done:
			t.Fatalf("agent ended: %v", ta.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("agent socket never appeared")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return ta
}

func (ta *testAgent) dial(t testing.TB) *control.Client {
	t.Helper()
	conn, err := net.Dial("unix", ta.sock)
	if err != nil {
		t.Fatal(err)
	}
	c, err := control.Dial(conn, testCapability, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func isRoot() bool { return os.Geteuid() == 0 }

// worldDir is a temporary directory that uid 1000 can enter (t.TempDir's parent is private).
func worldDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agtw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func ownerOf(fi os.FileInfo) (uint32, uint32) {
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// userDir is a temporary directory owned by uid 1000 when the tests run as root (the agent
// then works as that user), else by the test's user.
func userDir(t testing.TB) string {
	t.Helper()
	dir := worldDir(t)
	if isRoot() {
		if err := os.Chown(dir, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startHelperAgent re-executes the test binary to run the helper test named test, which serves
// an agent on the socket path it finds in the environment variable env, and dials it. The
// helper is killed and the connection closed when the test ends.
func startHelperAgent(t *testing.T, test, env string, attr *syscall.SysProcAttr) (*control.Client, *exec.Cmd) {
	t.Helper()
	dir, err := os.MkdirTemp("", "agt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ta := &testAgent{sock: filepath.Join(dir, "c.sock")}
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+ta.sock)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitFor(t, "the helper's socket", 20*time.Second, func() bool {
		_, err := os.Stat(ta.sock)
		return err == nil
	})
	return ta.dial(t), cmd
}
