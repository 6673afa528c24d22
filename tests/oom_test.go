package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAgentOutlivesItsWorkloadsOOM: a shell pipeline that runs a sandbox of 64 MiB out of
// memory (tail keeps all of head's 200 MiB, which has no newline) is OOM-killed a hundred
// times over, and every time the exec answers, says oom_killed with the shell's 137 (the
// process the kernel killed is tail, not the exec's own process), and the next exec answers:
// the OOM killer never takes the sandbox's agent over its workload (issue 45). Every tenth
// round also runs sixteen smaller pipelines at once, each tail smaller than the agent when the
// cgroup fills: on cgroup v1, where the agent shares the workloads' memory cgroup, its OOM
// score alone keeps it from being the pick (it was, at the first such run, before the
// scores).
func TestAgentOutlivesItsWorkloadsOOM(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	const id = "oom-pipeline"
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true, "resources": map[string]any{"memory_mb": 64}}), 201)
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil) })
	// The agent, the sandbox's PID 1, is the OOM killer's last pick, its workloads the first.
	// Where bothyd may not lower a score (no CAP_SYS_RESOURCE, as in this host's container),
	// the agent keeps bothyd's, this test's, and the workloads' alone go up.
	agentScore := "-999"
	if !hasSysResource(t) {
		b, err := os.ReadFile("/proc/self/oom_score_adj")
		if err != nil {
			t.Fatal(err)
		}
		agentScore = strings.TrimSpace(string(b))
	}
	// The agent raises a workload's score right after its start: the shell waits for it (a
	// bounded number of looks) before it prints its own.
	ownScore := `i=0; while read s </proc/$$/oom_score_adj; [ "$s" != 1000 ] && [ $i -lt 100000 ]; do i=$((i+1)); done; echo $s`
	for cmd, want := range map[string]string{"cat /proc/1/oom_score_adj": agentScore, ownScore: "1000"} {
		if got := d.exec(id, map[string]any{"command": []string{"sh", "-c", cmd}}); strings.TrimSpace(got.Stdout) != want {
			t.Errorf("%s inside the sandbox: %+v, want %s", cmd, got, want)
		}
	}
	before := oomKills(t, d, id)
	// What the kernel killed, for the diagnosis of a failure.
	defer func() {
		if t.Failed() {
			out, _ := exec.Command("sh", "-c", "dmesg | grep -E 'oom-kill:|Killed process|out of memory' | tail -8").CombinedOutput()
			t.Logf("the kernel's last OOM lines:\n%s", out)
		}
	}()
	const rounds = 100
	// Sixteen pipelines at once, of 16 MiB each.
	const spread = "for i in $(seq 16); do head -c 16m /dev/zero | tail & done; wait"
	for i := 1; i <= rounds; i++ {
		r := d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
			"command": []string{"sh", "-c", "head -c 200m /dev/zero | tail"}, "timeout_ms": 60000})
		if r.Status != 200 {
			sb := d.do("GET", "/v1/sandboxes/"+id, nil, nil)
			t.Fatalf("round %d of %d: the pipeline's exec answered %d %s; the sandbox: %s", i, rounds, r.Status, r.Body, sb.Body)
		}
		var got struct {
			ExitCode  int    `json:"exit_code"`
			OOMKilled bool   `json:"oom_killed"`
			Stderr    string `json:"stderr"`
		}
		if err := json.Unmarshal(r.Body, &got); err != nil {
			t.Fatalf("round %d: %v: %s", i, err, r.Body)
		}
		if got.ExitCode != 137 || !got.OOMKilled {
			t.Errorf("round %d: the pipeline exited %d with oom_killed %v (stderr %q), want 137 and true", i, got.ExitCode, got.OOMKilled, got.Stderr)
		}
		if i%10 == 0 {
			// Memory spread over pipelines side by side, each tail smaller than the agent when
			// the cgroup fills: by its size alone the agent would be the OOM killer's pick.
			// Some of them are killed, the rest finish; the exec answers either way.
			r = d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
				"command": []string{"sh", "-c", spread}, "timeout_ms": 60000})
			if r.Status != 200 {
				sb := d.do("GET", "/v1/sandboxes/"+id, nil, nil)
				t.Fatalf("round %d of %d: the side-by-side pipelines' exec answered %d %s; the sandbox: %s", i, rounds, r.Status, r.Body, sb.Body)
			}
		}
		alive := d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"echo", "alive"}})
		var said execJSON
		if alive.Status != 200 || json.Unmarshal(alive.Body, &said) != nil || said.Stdout != "alive\n" {
			sb := d.do("GET", "/v1/sandboxes/"+id, nil, nil)
			t.Fatalf("round %d of %d: the exec after the OOM kill answered %d %s; the sandbox: %s", i, rounds, alive.Status, alive.Body, sb.Body)
		}
	}
	// The kernel counted the kills the execs reported.
	if n := oomKills(t, d, id) - before; n < rounds {
		t.Errorf("the sandbox's cgroup counts %d OOM kills in %d rounds", n, rounds)
	}
}

// oomKills reads the OOM kills that the sandbox's memory cgroup counts (v1 memory.oom_control,
// v2 memory.events, hierarchical).
func oomKills(t *testing.T, d *daemon, id string) int64 {
	t.Helper()
	return keyed(cgroupFile(t, d, id, "memory.oom_control")+"\n"+cgroupFile(t, d, id, "memory.events"), "oom_kill")
}

// hasSysResource says whether this thread has CAP_SYS_RESOURCE in effect, which lowering an
// OOM score needs.
func hasSysResource(t *testing.T) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	return data[0].Effective&(1<<unix.CAP_SYS_RESOURCE) != 0
}
