//go:build linux

package platform

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// The v2 driver against a fake cgroup tree: a temporary directory whose files stand for the
// kernel's. A write to such a file lands in it as written (the kernel's files are not
// truncated either: each write is one command), so each test starts the files empty or with
// what the kernel would show and reads back what the driver wrote. The real hierarchy is
// exercised by the tests of runtime/namespace and tests/ on a cgroup v2 host.

// fakeTree makes the files (relative path → contents) below a new temporary root.
func fakeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func readFake(t *testing.T, root, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, p))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func fakeCgroupV2(root, name string) *Cgroup {
	return &Cgroup{name: name, drv: newCgroupV2(root, name)}
}

func TestMissingControllers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, have string
		want       []string
	}{
		{"none enabled", "", []string{"+memory", "+cpu", "+pids"}},
		{"all enabled by systemd", "cpuset cpu io memory pids\n", nil},
		{"some", "memory io\n", []string{"+cpu", "+pids"}},
		{"a prefix is not the controller", "cpuset memory pids", []string{"+cpu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := missingControllers(tc.have, cgroupV2Controllers); !slices.Equal(got, tc.want) {
				t.Fatalf("missingControllers(%q) = %q, want %q", tc.have, got, tc.want)
			}
		})
	}
}

// Create writes each ancestor's cgroup.subtree_control only for what it lacks (the levels
// systemd owns are left alone when they have the controllers), and the v2 limit files.
func TestCgroupV2CreateWritesOnlyMissingControllers(t *testing.T) {
	t.Parallel()
	root := fakeTree(t, map[string]string{
		"cgroup.subtree_control":                        "cpuset cpu io memory pids\n",
		"system.slice/cgroup.subtree_control":           "cpu memory pids\n",
		"system.slice/b.service/cgroup.subtree_control": "",
		"system.slice/b.service/sb.x/memory.max":        "",
		"system.slice/b.service/sb.x/memory.swap.max":   "",
		"system.slice/b.service/sb.x/cpu.max":           "",
		"system.slice/b.service/sb.x/pids.max":          "",
	})
	cg := fakeCgroupV2(root, "system.slice/b.service/sb.x")
	if err := cg.Create(CgroupLimits{MemoryBytes: 64 << 20, VCPUs: 2, Pids: 40}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{
		"cgroup.subtree_control":                        "cpuset cpu io memory pids\n",
		"system.slice/cgroup.subtree_control":           "cpu memory pids\n",
		"system.slice/b.service/cgroup.subtree_control": "+memory +cpu +pids",
		"system.slice/b.service/sb.x/memory.max":        "67108864",
		"system.slice/b.service/sb.x/memory.swap.max":   "0",
		"system.slice/b.service/sb.x/cpu.max":           "200000 100000",
		"system.slice/b.service/sb.x/pids.max":          "40",
	} {
		if got := readFake(t, root, p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if !cg.Exists() || !slices.Equal(cg.Dirs(), []string{filepath.Join(root, "system.slice/b.service/sb.x")}) {
		t.Fatalf("Dirs = %v", cg.Dirs())
	}
}

// A kernel without swap accounting has no memory.swap.max: the memory limit still holds.
func TestCgroupV2CreateWithoutSwapAccounting(t *testing.T) {
	t.Parallel()
	root := fakeTree(t, map[string]string{
		"cgroup.subtree_control": "memory cpu pids",
		"sb.x/memory.max":        "",
	})
	if err := fakeCgroupV2(root, "sb.x").Create(CgroupLimits{MemoryBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := readFake(t, root, "sb.x/memory.max"); got != "1048576" {
		t.Fatalf("memory.max = %q", got)
	}
}

// OOM kills come from memory.events' oom_kill (hierarchical: a workloads child's count
// shows in the sandbox's), and hits of the limit from its max.
func TestCgroupV2MemoryEvents(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, events string
		oom          bool
		max          uint64
	}{
		{"none", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n", false, 0},
		{"hit, reclaimed", "low 0\nhigh 0\nmax 7\noom 0\noom_kill 0\n", false, 7},
		{"killed", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n", true, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := fakeTree(t, map[string]string{"sb.x/memory.events": tc.events})
			cg := fakeCgroupV2(root, "sb.x")
			if oom, err := cg.OOMKilled(); err != nil || oom != tc.oom {
				t.Errorf("OOMKilled = %v, %v; want %v", oom, err, tc.oom)
			}
			if n, err := cg.MemoryFailures(); err != nil || n != tc.max {
				t.Errorf("MemoryFailures = %d, %v; want %d", n, err, tc.max)
			}
		})
	}
}

// Freeze writes cgroup.freeze and is done only once cgroup.events says "frozen 1"; Thaw the
// same with 0.
func TestCgroupV2FreezeWaitsForEvents(t *testing.T) {
	t.Parallel()
	root := fakeTree(t, map[string]string{
		"sb.x/cgroup.freeze": "0",
		"sb.x/cgroup.events": "populated 1\nfrozen 0\n",
	})
	cg := fakeCgroupV2(root, "sb.x")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := cg.Freeze(ctx); err == nil {
		t.Fatal("Freeze returned before cgroup.events said frozen 1")
	}
	if frozen, err := cg.Frozen(); err != nil || !frozen {
		t.Fatalf("Frozen after the write = %v, %v", frozen, err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- cg.Freeze(ctx)
	}()
	if err := os.WriteFile(filepath.Join(root, "sb.x/cgroup.events"), []byte("populated 1\nfrozen 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Thawed: the kernel shows 0 in both.
	if err := os.WriteFile(filepath.Join(root, "sb.x/cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := cg.Thaw(ctx2); err != nil {
		t.Fatal(err)
	}
	if got := readFake(t, root, "sb.x/cgroup.freeze"); got != "0" {
		t.Fatalf("cgroup.freeze after Thaw = %q", got)
	}
	// A cgroup that is gone is thawed.
	if err := fakeCgroupV2(root, "gone").Thaw(ctx2); err != nil {
		t.Fatal(err)
	}
}

// SplitV2 makes the agent's and the workloads' children and gives the sandbox's root (owner)
// the two cgroup.procs files CLONE_INTO_CGROUP checks, and nothing else; SettleV2 moves the
// init into agent, delegates pids and limits the workloads.
func TestCgroupV2SplitAndSettle(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown); CI runs as root")
	}
	const owner = 1234567
	root := fakeTree(t, map[string]string{
		"sb.x/cgroup.procs":           "",
		"sb.x/cgroup.subtree_control": "",
		"sb.x/pids.max":               "",
		"sb.x/workloads/cgroup.procs": "",
		"sb.x/workloads/pids.max":     "",
		"sb.x/workloads/memory.max":   "",
		"sb.x/agent/cgroup.procs":     "",
	})
	cg := fakeCgroupV2(root, "sb.x")
	dir, err := cg.SplitV2(owner)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	var st, want syscall.Stat_t
	if err := syscall.Fstat(int(dir.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(root, "sb.x", V2WorkloadsCgroup), &want); err != nil {
		t.Fatal(err)
	}
	if st.Ino != want.Ino {
		t.Fatal("SplitV2 did not open the workloads' directory")
	}
	for p, ownerWant := range map[string]uint32{
		"sb.x/cgroup.procs":           owner,
		"sb.x/workloads/cgroup.procs": owner,
		"sb.x/agent/cgroup.procs":     0,
		"sb.x/cgroup.subtree_control": 0,
		"sb.x/pids.max":               0,
		"sb.x/workloads/pids.max":     0,
		"sb.x/workloads":              0,
		"sb.x":                        0,
	} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(root, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != ownerWant || st.Gid != ownerWant {
			t.Errorf("%s is owned by %d:%d, want %d", p, st.Uid, st.Gid, ownerWant)
		}
	}
	// The workloads get the sandbox's memory limit of their own, so that an OOM among them
	// never picks the agent (memory.swap.max is absent here, as on a kernel without swap
	// accounting, and skipped).
	if err := cg.SettleV2(4242, 16, 64<<20); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{
		"sb.x/agent/cgroup.procs":     "4242",
		"sb.x/cgroup.subtree_control": "+pids +memory",
		"sb.x/workloads/pids.max":     "16",
		"sb.x/workloads/memory.max":   "67108864",
	} {
		if got := readFake(t, root, p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
}

// Without a user namespace (owner -1) nothing is given away.
func TestCgroupV2SplitWithoutOwner(t *testing.T) {
	t.Parallel()
	root := fakeTree(t, map[string]string{"sb.x/cgroup.procs": ""})
	dir, err := fakeCgroupV2(root, "sb.x").SplitV2(-1)
	if err != nil {
		t.Fatal(err)
	}
	dir.Close()
	for _, child := range []string{V2AgentCgroup, V2WorkloadsCgroup} {
		if fi, err := os.Stat(filepath.Join(root, "sb.x", child)); err != nil || !fi.IsDir() {
			t.Fatalf("child %s: %v", child, err)
		}
	}
}

// Remove writes cgroup.kill where the kernel has it, and removes the children before the
// cgroup.
func TestCgroupV2RemoveKillsAndRemovesChildren(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for _, d := range []string{"sb.x/agent", "sb.x/workloads"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cg := fakeCgroupV2(root, "sb.x")
	// A fake directory with a file in it cannot be removed, unlike a cgroup's: the write to
	// cgroup.kill is checked on another.
	killed := fakeTree(t, map[string]string{"kd/cgroup.kill": ""})
	newCgroupV2(killed, "kd").killAll()
	if got := readFake(t, killed, "kd/cgroup.kill"); got != "1" {
		t.Fatalf("cgroup.kill = %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cg.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if cg.Exists() {
		t.Fatal("the cgroup is still there")
	}
}

// TestAgentOOMKilledV2: the agent's OOM kills are its own child's count, not the sandbox's,
// which counts the workloads' too; without a memory.events in the child (no memory limit,
// so no memory controller there) the sandbox's stands in.
func TestAgentOOMKilledV2(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  bool
	}{
		{"a workload killed", map[string]string{"sb/memory.events": "oom 2\noom_kill 2\n", "sb/agent/memory.events": "oom 0\noom_kill 0\n", "sb/workloads/memory.events": "oom 2\noom_kill 2\n"}, false},
		{"the agent killed", map[string]string{"sb/memory.events": "oom 1\noom_kill 1\n", "sb/agent/memory.events": "oom 1\noom_kill 1\n"}, true},
		{"no split", map[string]string{"sb/memory.events": "oom 1\noom_kill 1\n"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := fakeTree(t, tc.files)
			got, err := fakeCgroupV2(root, "sb").AgentOOMKilled()
			if err != nil || got != tc.want {
				t.Fatalf("AgentOOMKilled = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
