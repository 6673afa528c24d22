//go:build linux

package namespace

import (
	"context"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// TestProcessesIgnoreForgedMarkers: a workload inside a sandbox runs processes whose argv is
// the runtime's marker (sh __shim <dir>, sh __init <dir>, for a directory of this state root);
// Processes reports the sandbox's real shim and init and neither forgery. Without identifying
// runtime processes by what a sandbox cannot forge, both forgeries are reported (as a shim
// and an init), and the checker would take them for unrecorded runtime processes.
func TestProcessesIgnoreForgedMarkers(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "forger", runtime.Resources{})
	victim := s.spec.Dir
	// Each forgery is a shell running a script named like the marker's sub-command, so that
	// its argv is exactly: /bin/sh __shim|__init <dir>.
	if r := s.sh(t, "user", "cd /home/user && echo 'sleep 600' > "+shim.ShimCommand+" && cp "+shim.ShimCommand+" "+shim.InitCommand); r.Code != 0 {
		t.Fatalf("writing the forgers' scripts: %+v", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	forgers := map[string]int{} // sub-command → host pid
	for _, sub := range []string{shim.ShimCommand, shim.InitCommand} {
		p, err := s.client.Exec(ctx, control.ExecRequest{Argv: []string{"/bin/sh", sub, victim}, Cwd: "/home/user"})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = io.Copy(io.Discard, p.Stdout) }()
		go func() { _, _ = io.Copy(io.Discard, p.Stderr) }()
	}
	// Wait until the host sees both forgeries under their forged argv: the claim is made.
	deadline := time.Now().Add(15 * time.Second)
	for len(forgers) < 2 {
		for _, sub := range []string{shim.ShimCommand, shim.InitCommand} {
			if pid := findArgv(t, "/bin/sh", sub, victim); pid != 0 {
				forgers[sub] = pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forged processes did not show on the host (found %v)", forgers)
		}
		time.Sleep(5 * time.Millisecond)
	}

	procs, err := rt.Processes(root)
	if err != nil {
		t.Fatal(err)
	}
	roles := map[runtime.Role]int{}
	for _, p := range procs {
		for sub, pid := range forgers {
			if p.ID.Pid == pid {
				t.Errorf("Processes reports the forgery (sh %s %s), pid %d, as a %s", sub, victim, pid, p.Role)
			}
		}
		if p.Dir != victim {
			t.Errorf("Processes reports a %s of %s, which runs no sandbox", p.Role, p.Dir)
		}
		roles[p.Role]++
	}
	if roles[runtime.RoleShim] != 1 || roles[runtime.RoleInit] != 1 {
		t.Errorf("Processes found %v, want the sandbox's one shim and one init: %+v", roles, procs)
	}
	for _, p := range procs {
		if p.Role == runtime.RoleShim && p.ID != s.id {
			t.Errorf("the shim found is %s, want the one started, %s", p.ID, s.id)
		}
	}
}

// findArgv returns the pid of a process on the host whose argv is exactly argv, or 0.
func findArgv(t *testing.T, argv ...string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join(argv, "\x00") + "\x00"
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == want {
			return pid
		}
	}
	return 0
}
