package tests

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestContractSmallPids: every pids limit the schema accepts gives a sandbox that starts and
// runs commands, the small ones included (the agent's own threads are not counted against
// the limit), and no such start or exec answers a 5xx. The limit still holds: a workload that
// forks far past it is refused forks, and pids N leaves it at least N. On cgroup v1 and v2
// alike the workload's forks never take the agent's allowance: a command started at the
// limit is refused with pids-limit, and the sandbox runs on.
func TestContractSmallPids(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	for n := 1; n <= 8; n++ {
		id := fmt.Sprintf("pids-%d", n)
		r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true, "resources": map[string]any{"pids": n}})
		t.Cleanup(func() {
			d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
			d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
		})
		if r.Status != 201 {
			t.Errorf("pids %d: create and start answered %d: %s", n, r.Status, r.Body)
			continue
		}
		if sb := decode[sandboxJSON](t, r, 201); sb.State != "running" {
			t.Errorf("pids %d: state %q after a start, want running", n, sb.State)
			continue
		}
		r = d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"sh", "-c", "echo ok"}})
		if r.Status != 200 {
			t.Errorf("pids %d: exec answered %d: %s", n, r.Status, r.Body)
			continue
		}
		if got := decode[execJSON](t, r, 200); got.ExitCode != 0 || got.Stdout != "ok\n" {
			t.Errorf("pids %d: exec %+v, want ok", n, got)
		}
	}

	// pids 4: the shell and three children of its own run at once.
	got := d.exec("pids-4", map[string]any{"command": []string{"sh", "-c", "sleep 1 & sleep 1 & sleep 1 & wait; echo four"}})
	if got.ExitCode != 0 || got.Stdout != "four\n" {
		t.Errorf("pids 4: a shell with three children: %+v", got)
	}
	// pids 1: a hundred children is far beyond the limit and the agent's allowance. The
	// workload's processes have a cgroup of their own, limited to 1 (on cgroup v1 and the
	// agent's forking thread, which moves there to fork; on v2 they are cloned straight into
	// it): the forks are refused there and the agent keeps its allowance, so it answers, and
	// the sandbox lives on.
	w := workloadsCgroup(t)
	if max := cgroupFile(t, d, "pids-1", w.dir+"/pids.max"); max != strconv.Itoa(1+w.forkingThread) {
		t.Fatalf("pids 1: the workloads' cgroup has pids.max %q, want %d", max, 1+w.forkingThread)
	}
	r := d.doJSON("POST", "/v1/sandboxes/pids-1/exec", map[string]any{"command": []string{"sh", "-c", "i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); done; echo forked $i"}})
	if r.Status != 200 {
		t.Errorf("pids 1: a hundred forks answered %d: %s", r.Status, r.Body)
	} else if got := decode[execJSON](t, r, 200); got.ExitCode == 0 || !strings.Contains(got.Stderr, "fork") {
		t.Errorf("pids 1: a hundred forks were not refused: %+v", got)
	}
	// While the workload's processes are at the limit, a command cannot start; the agent
	// says so, and the sandbox runs on.
	if r := d.doJSON("POST", "/v1/sandboxes/pids-1/exec", map[string]any{"command": []string{"true"}}); r.Status != 200 {
		wantProblem(t, r, 409, "pids-limit")
	}
	waitFor(t, 30*time.Second, "the fork bomb's tasks to end", func() bool {
		r := d.doJSON("POST", "/v1/sandboxes/pids-1/exec", map[string]any{"command": []string{"true"}})
		if r.Status != 200 {
			wantProblem(t, r, 409, "pids-limit")
		}
		return r.Status == 200 && decode[execJSON](t, r, 200).ExitCode == 0
	})
	if got := d.exec("pids-1", map[string]any{"command": []string{"echo", "after"}}); got.Stdout != "after\n" {
		t.Errorf("pids 1: an exec after the forks were refused: %+v", got)
	}
}
