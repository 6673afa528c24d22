//go:build linux

package platform

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestValidCgroupName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"bothy/abc", "a", "bothy/a-b_c.d"} {
		if err := validCgroupName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/abs", "a/../b", "..", "a//b", "A", "a b", "a/"} {
		if err := validCgroupName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseMountinfoLine(t *testing.T) {
	t.Parallel()
	e, ok := parseMountinfoLine(`36 35 98:0 /mnt1 /mnt\040x rw,noatime master:1 - ext3 /dev/root rw,errors=continue`)
	if !ok || e.point != "/mnt x" || e.root != "/mnt1" || e.fstype != "ext3" || e.superOpts != "rw,errors=continue" {
		t.Fatalf("got %+v %v", e, ok)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups and mounts); CI runs as root")
	}
}

// testCgroup opens the cgroup name for a test, which removes it, and its parents the test made,
// when it ends.
func testCgroup(t *testing.T, name string) *Cgroup {
	t.Helper()
	cg, err := OpenCgroup(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cg.Remove(context.Background())
		for _, d := range cg.Dirs() {
			_ = os.Remove(filepath.Dir(d))
		}
	})
	return cg
}

func TestCgroupLifecycle(t *testing.T) {
	needRoot(t)
	if _, err := CgroupVersion(); err != nil {
		t.Skipf("no usable cgroup hierarchy: %v", err)
	}
	name := fmt.Sprintf("bothyd-test/cg-%d", os.Getpid())
	cg := testCgroup(t, name)
	if err := cg.Create(CgroupLimits{MemoryBytes: 64 << 20, VCPUs: 1, Pids: 16}); err != nil {
		t.Fatal(err)
	}
	if !cg.Exists() {
		t.Fatal("cgroup missing after Create")
	}
	if cg.V2() {
		testCgroupLifecycleV2(t, cg, name)
		return
	}
	// A process forked from a thread that entered the cgroup is born in it.
	var cmd *exec.Cmd
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		leave, err := cg.EnterThread()
		if err != nil {
			errc <- err
			return
		}
		cmd = exec.Command("sleep", "60")
		err = cmd.Start()
		if lerr := leave(); err == nil {
			err = lerr
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Wait() }()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, ctl := range []string{"memory", "pids", "cpu"} {
		if !strings.Contains(string(b), ctl+":/"+name) && !strings.Contains(string(b), ","+ctl+":/"+name) && !strings.Contains(string(b), ctl+",") {
			t.Errorf("child not in %s cgroup %s:\n%s", ctl, name, b)
		}
	}
	self, _ := os.ReadFile("/proc/self/cgroup")
	if strings.Contains(string(self), name) {
		t.Fatalf("the test process stayed in the cgroup:\n%s", self)
	}
	pids, err := cg.Pids()
	if err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("Pids = %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cg.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if cg.Exists() {
		t.Fatal("cgroup still exists after Remove")
	}
	if oom, err := cg.OOMKilled(); err == nil || oom {
		t.Fatalf("OOMKilled on a removed cgroup = %v, %v", oom, err)
	}
}

// TestCgroupPidsChild: a thread moved into a pids child (by the files PidsChild opens) forks
// there, under the child's limit; the cgroup's Pids include the child's processes, and Remove
// kills them and removes the child with the cgroup.
func TestCgroupPidsChild(t *testing.T) {
	needRoot(t)
	if v, err := CgroupVersion(); err != nil || v != 1 {
		t.Skipf("a pids child cgroup is for cgroup v1 (version %d, %v)", v, err)
	}
	name := fmt.Sprintf("bothyd-test/child-%d", os.Getpid())
	cg := testCgroup(t, name)
	if err := cg.Create(CgroupLimits{Pids: 16}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cg.PidsChild("../up", 1); err == nil {
		t.Fatal("PidsChild took a name with a slash")
	}
	// 2: the forking thread counts there while it forks, and one child.
	child, self, err := cg.PidsChild("workload", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer child.Close()
	defer self.Close()
	// As the agent does: a thread in the cgroup (here: entered, as the shim's forking thread
	// does) moves into the child by the file, forks, and moves back by the other file. A
	// thread that did not get back out is never unlocked, so that it ends with its goroutine
	// rather than leave the test process in the cgroup that Remove kills.
	start := func(n int) (cmds []*exec.Cmd, forkErr error) {
		done := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			leave, err := cg.EnterThread()
			if err != nil {
				done <- err
				return
			}
			if err := MoveThreadTo(child); err != nil {
				done <- err
				return
			}
			for range n {
				cmd := exec.Command("sleep", "60")
				if forkErr = cmd.Start(); forkErr != nil {
					break
				}
				cmds = append(cmds, cmd)
			}
			if err := MoveThreadTo(self); err != nil {
				done <- err
				return
			}
			if err := leave(); err != nil {
				done <- err
				return
			}
			runtime.UnlockOSThread()
			done <- nil
		}()
		if err := <-done; err != nil {
			t.Fatalf("moving the forking thread: %v", err)
		}
		return cmds, forkErr
	}
	cmds, err := start(2)
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	if len(cmds) != 1 || err == nil {
		t.Fatalf("forks in a child of pids.max 2: %d started, err %v; want 1 and a refusal", len(cmds), err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmds[0].Process.Pid))
	if err != nil || !strings.Contains(string(b), "pids:/"+name+"/workload") {
		t.Fatalf("the child is not in the workloads' cgroup (%v):\n%s", err, b)
	}
	if self, _ := os.ReadFile("/proc/self/cgroup"); strings.Contains(string(self), name) {
		t.Fatalf("the test process stayed in the cgroup:\n%s", self)
	}
	pids, err := cg.Pids()
	if err != nil || len(pids) != 1 || pids[0] != cmds[0].Process.Pid {
		t.Fatalf("Pids = %v, %v; want [%d]", pids, err, cmds[0].Process.Pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cg.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if cg.Exists() {
		t.Fatal("cgroup still exists after Remove")
	}
}

// testCgroupLifecycleV2 is TestCgroupLifecycle's v2 half: a process cloned into the cgroup
// (CLONE_INTO_CGROUP) is in it, a freeze waits for cgroup.events' frozen 1 and a thaw for 0,
// and Remove kills it (cgroup.kill where the kernel has it) and removes the cgroup.
func testCgroupLifecycleV2(t *testing.T, cg *Cgroup, name string) {
	dir, err := cg.OpenDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	err = cmd.Start()
	dir.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(b)), ":/"+name) {
		t.Fatalf("the child is not in %s (%v): %s", name, err, b)
	}
	pids, err := cg.Pids()
	if err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("Pids = %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cg.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if frozen, err := cg.Frozen(); err != nil || !frozen {
		t.Fatalf("Frozen after Freeze = %v, %v", frozen, err)
	}
	if err := cg.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	if frozen, err := cg.Frozen(); err != nil || frozen {
		t.Fatalf("Frozen after Thaw = %v, %v", frozen, err)
	}
	if err := cg.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if cg.Exists() {
		t.Fatal("cgroup still exists after Remove")
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("the child survived Remove")
	}
}
