//go:build linux

package platform

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestHoldCgroupMoves runs HoldCgroup in a process of its own (the test binary again) that
// sees a cgroup v2 hierarchy at /sys/fs/cgroup: on this project's cgroup v1 test hosts, a
// private mount namespace with the kernel's v2 hierarchy mounted there. HoldCgroup must move
// that process into the leaf below its own cgroup and then refuse, naming the units'
// accounting settings, because no controller is available to v2 on a v1 host. (The guest
// suite runs the whole of it under systemd, where the controllers are.)
func TestHoldCgroupMoves(t *testing.T) {
	if os.Getenv("BOTHY_HOLD_HELPER") != "" {
		holdHelper()
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting a cgroup hierarchy needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skipf("no unshare(1): %v", err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(unifiedMount, &fs); err != nil || fs.Type == unix.CGROUP2_SUPER_MAGIC {
		t.Skip("a cgroup v2 host: HoldCgroup would move this test's own cgroup; the guest suite runs it under systemd")
	}
	own, err := ownUnifiedCgroup()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy on this kernel: %v", err)
	}
	leaf := fmt.Sprintf("bothy-hold-test-%d", os.Getpid())
	inV2 := func(script string, args ...string) ([]byte, error) {
		cmd := exec.Command("unshare", append([]string{"-m", "--propagation", "private", "sh", "-c",
			"mount -t cgroup2 none " + unifiedMount + " && " + script}, args...)...)
		cmd.Env = append(os.Environ(), "BOTHY_HOLD_HELPER="+leaf)
		return cmd.CombinedOutput()
	}
	t.Cleanup(func() {
		// The helper has exited, so the leaf holds no process and can go.
		if out, err := inV2(`rmdir "$0"`, filepath.Join(unifiedMount, own, leaf)); err != nil {
			t.Errorf("removing the test's leaf: %v\n%s", err, out)
		}
	})
	out, err := inV2(`exec "$0" -test.run '^TestHoldCgroupMoves$' -test.v`, os.Args[0])
	if err != nil || !strings.Contains(string(out), "HOLD-OK") {
		t.Fatalf("the helper: %v\n%s", err, out)
	}
}

// holdHelper is the process that TestHoldCgroupMoves starts with a v2 hierarchy mounted.
func holdHelper() {
	leaf := os.Getenv("BOTHY_HOLD_HELPER")
	before, err := ownUnifiedCgroup()
	if err != nil {
		fmt.Println("own cgroup:", err)
		os.Exit(1)
	}
	_, _, err = HoldCgroup(leaf, []string{"memory"})
	if err == nil || !strings.Contains(err.Error(), "MemoryAccounting=yes") {
		fmt.Println("HoldCgroup without a memory controller:", err)
		os.Exit(1)
	}
	after, err := ownUnifiedCgroup()
	if want := filepath.Join(before, leaf); err != nil || after != want {
		fmt.Printf("after HoldCgroup the process is in %q (%v), want %q\n", after, err, want)
		os.Exit(1)
	}
	// Again, as when systemd starts the unit anew, in the unit's cgroup: the leaf exists.
	if err := os.WriteFile(filepath.Join(unifiedMount, before, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0); err != nil {
		fmt.Println("moving back:", err)
		os.Exit(1)
	}
	if _, _, err := HoldCgroup(leaf, nil); err != nil {
		fmt.Println("HoldCgroup into an existing leaf, nothing to enable:", err)
		os.Exit(1)
	}
	fmt.Println("HOLD-OK")
}
