package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/supervisor/control"
)

var testCapability = []byte("0123456789abcdef0123456789abcdef")

type testAgent struct {
	sock   string
	cancel context.CancelFunc
	done   chan error
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
	}
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{sock: cfg.ListenPath, cancel: cancel, done: make(chan error, 1)}
	go func() { ta.done <- RunContext(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-ta.done:
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop")
		}
	})
	// Wait for the socket to appear (the condition), with a deadline.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Stat(cfg.ListenPath); err == nil && fi.Mode().Type() == os.ModeSocket {
			break
		}
		select {
		case err := <-ta.done:
			t.Fatalf("agent ended: %v", err)
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

var _ = errors.Is
