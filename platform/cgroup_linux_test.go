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
	"testing"
	"time"
)

func TestValidCgroupName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"sandboxd/abc", "a", "sandboxd/a-b_c.d"} {
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

func TestCgroupLifecycle(t *testing.T) {
	needRoot(t)
	if _, err := CgroupVersion(); err != nil {
		t.Skipf("no usable cgroup hierarchy: %v", err)
	}
	name := fmt.Sprintf("sandboxd-test/cg-%d", os.Getpid())
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
	if err := cg.Create(CgroupLimits{MemoryBytes: 64 << 20, VCPUs: 1, Pids: 16}); err != nil {
		t.Fatal(err)
	}
	if !cg.Exists() {
		t.Fatal("cgroup missing after Create")
	}
	if cg.V2() {
		t.Skip("cgroup v2 host: thread placement is tested on v1 only")
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
