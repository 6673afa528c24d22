//go:build linux

package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

// sharedAssets holds the initramfs and the host base disk for every test: the base disk takes
// some seconds to make, once.
var sharedAssets string

// TestMain dispatches the runtime's sub-commands, as cmd/bothyd does: the runtime
// re-executes this test binary as the shim, and boots it as the guest's /init.
func TestMain(m *testing.M) {
	if code, ran := shim.Main(os.Args[1:]); ran {
		os.Exit(code)
	}
	dir, err := os.MkdirTemp("", "bothyd-microvm-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedAssets = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newRuntime returns the runtime under TCG (QEMU aborts under this host's nested KVM, and on
// hosts where nested KVM stalls a guest a probe would spend its timeout finding that out), or
// skips the test where microVMs cannot run.
func newRuntime(t *testing.T) *Runtime {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the microvm runtime's base disk is made as root (file owners); CI runs as root")
	}
	r, err := New(Config{Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	if r.refusal != nil {
		t.Skipf("microVMs cannot run here: %v", r.refusal)
	}
	return r
}

// vmContext bounds a test that boots guests: TCG is slow, and the machine is shared.
func vmContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// dialAgent dials the control socket as the supervisor does, once the shim listens: without
// following a link, and only to a listener whose peer credentials name the shim.
func dialAgent(ctx context.Context, t *testing.T, r *Runtime, dir string, proc platform.ProcessID, capability []byte) *control.Client {
	t.Helper()
	for {
		conn, err := platform.DialUnixNoFollow(ctx, r.ControlPath(dir))
		if err == nil {
			pid, uid, _, err := platform.PeerCred(conn)
			if err != nil || pid != proc.Pid || uid != os.Geteuid() {
				t.Fatalf("the control socket's peer is pid %d uid %d (%v), not the shim %d", pid, uid, err, proc.Pid)
			}
			c, err := control.Dial(conn, capability, time.Minute)
			if err != nil {
				t.Fatalf("hello: %v", err)
			}
			return c
		}
		if !proc.Alive() {
			log, _ := os.ReadFile(filepath.Join(dir, shim.EntryLog))
			t.Fatalf("the shim ended before the agent answered; its log:\n%s", log)
		}
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(filepath.Join(dir, shim.EntryLog))
			t.Fatalf("the agent did not answer: %v; the log:\n%s", err, log)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
