//go:build linux

package platform

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// splitHelperEnv makes the test binary the process of TestCgroupV2SplitPermissions that plays
// the agent.
const splitHelperEnv = "BOTHY_TEST_SPLIT_HELPER"

// TestCgroupV2SplitPermissions proves on a real cgroup v2 hierarchy what SplitV2's comment
// says: a process of the sandbox's root's host uid, with no capability, in the agent's child,
// can clone a child straight into the workloads' child (CLONE_INTO_CGROUP), where the
// workloads' limit refuses its forks, and cannot clone into the agent's child or the
// sandbox's cgroup, nor write a limit.
func TestCgroupV2SplitPermissions(t *testing.T) {
	needRoot(t)
	if v, err := CgroupVersion(); err != nil || v != 2 {
		t.Skipf("the v2 split needs cgroup v2 (version %d, %v)", v, err)
	}
	const owner = 1234567
	name := fmt.Sprintf("bothyd-test/split-%d", os.Getpid())
	cg := testCgroup(t, name)
	if err := cg.Create(CgroupLimits{Pids: 20}); err != nil {
		t.Fatal(err)
	}
	workloads, err := cg.SplitV2(owner)
	if err != nil {
		t.Fatal(err)
	}
	defer workloads.Close()
	dir, err := cg.OpenDir()
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	// The helper starts in the sandbox's cgroup, as the init does, and waits for SettleV2.
	cmd := exec.Command(os.Args[0], "-test.run=^TestCgroupV2SplitHelper$")
	cmd.Env = append(os.Environ(), splitHelperEnv+"=1")
	cmd.ExtraFiles = []*os.File{workloads}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		UseCgroupFD: true, CgroupFD: int(dir.Fd()),
		Credential: &syscall.Credential{Uid: owner, Gid: owner},
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := cg.SettleV2(cmd.Process.Pid, 2, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		got[k] = v
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v (%v)", err, got)
	}
	want := map[string]string{
		"own cgroup":             "/" + name + "/" + V2AgentCgroup,
		"clone into workloads":   "ok /" + name + "/" + V2WorkloadsCgroup,
		"second into workloads":  "ok",
		"third into workloads":   "resource temporarily unavailable", // pids.max 2
		"clone into agent":       "permission denied",
		"clone into the sandbox": "device or resource busy", // its cgroup.procs is owner's, but it delegates pids
		"write pids.max":         "permission denied",
		"write subtree_control":  "permission denied",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}

// TestCgroupV2SplitHelper is the agent of TestCgroupV2SplitPermissions when the test binary
// runs as its helper; otherwise it does nothing.
func TestCgroupV2SplitHelper(t *testing.T) {
	if os.Getenv(splitHelperEnv) == "" {
		return
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		os.Exit(2)
	}
	h, err := cgroupHierarchies()
	if err != nil {
		os.Exit(2)
	}
	self, _ := os.ReadFile("/proc/self/cgroup")
	own := strings.TrimPrefix(strings.TrimSpace(string(self)), "0::")
	fmt.Printf("own cgroup: %s\n", own)
	sandbox := filepath.Join(h.v2, filepath.Dir(own))
	result := func(err error) string {
		if err == nil {
			return "ok"
		}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return errno.Error()
		}
		return err.Error()
	}
	var sleepers []*exec.Cmd
	defer func() {
		for _, c := range sleepers {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	into := func(fd int) (*exec.Cmd, error) {
		c := exec.Command("sleep", "30")
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		if err := c.Start(); err != nil {
			return nil, err
		}
		sleepers = append(sleepers, c)
		return c, nil
	}
	c, err := into(3)
	if err == nil {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", c.Process.Pid))
		fmt.Printf("clone into workloads: ok %s\n", strings.TrimPrefix(strings.TrimSpace(string(b)), "0::"))
	} else {
		fmt.Printf("clone into workloads: %s\n", result(err))
	}
	_, err = into(3)
	fmt.Printf("second into workloads: %s\n", result(err))
	_, err = into(3)
	fmt.Printf("third into workloads: %s\n", result(err))
	for _, tc := range []struct{ what, dir string }{
		{"clone into agent", filepath.Join(sandbox, V2AgentCgroup)},
		{"clone into the sandbox", sandbox},
	} {
		f, err := os.Open(tc.dir)
		if err == nil {
			_, err = into(int(f.Fd()))
			f.Close()
		}
		fmt.Printf("%s: %s\n", tc.what, result(err))
	}
	fmt.Printf("write pids.max: %s\n", result(writeCgroupFile(sandbox, "pids.max", "max")))
	fmt.Printf("write subtree_control: %s\n", result(writeCgroupFile(sandbox, "cgroup.subtree_control", "-pids")))
	os.Stdout.Sync()
}
