package tests

import (
	"strings"
	"testing"
)

// privilegesScript prints the capability, no_new_privs and seccomp lines of the workload
// itself, then of every thread of the sandbox's agent (PID 1), each after a line "agent".
const privilegesScript = `grep -E '^(CapPrm|CapEff|CapInh|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status
for f in /proc/1/task/*/status; do echo agent; grep -E '^(CapPrm|CapEff|CapInh|CapAmb|NoNewPrivs|Seccomp):' "$f"; done`

// TestPrivilegesOfEveryProcess: a root workload's bounding set is its permitted and effective
// set, which is neither empty nor everything, its ambient set is empty, and every thread of the
// agent holds no more, with no_new_privs and the seccomp filter. The init of the README's
// binary (built without cgo) limits all the agent's threads at once but bounds only its own
// thread's bounding set: the agent bounds each workload's fork on its thread. Both halves are
// checked, with and without user namespaces.
func TestPrivilegesOfEveryProcess(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
	}{
		{"user namespace", nil},
		{"host ids", []string{"--user-namespaces=false"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := startDaemon(t, withArgs(c.args...))
			d.create("privs", true)
			// Twice: the second exec may fork from a thread the first one bounded, or not.
			for range 2 {
				got := d.exec("privs", map[string]any{"command": []string{"sh", "-c", privilegesScript}, "user": "root"})
				if got.ExitCode != 0 {
					t.Fatalf("the script: %+v", got)
				}
				if why := boundedEverywhere(got.Stdout); why != "" {
					t.Fatalf("%s:\n%s", why, got.Stdout)
				}
			}
		})
	}
}

// boundedEverywhere checks privilegesScript's output, and says what is wrong ("" if nothing).
func boundedEverywhere(out string) string {
	blocks := strings.Split(out, "agent\n")
	own := statusFields(blocks[0])
	eff := own["CapEff"]
	switch {
	case eff == "" || strings.Trim(eff, "0") == "" || eff == "000001ffffffffff":
		return "the workload's effective set is " + eff
	case own["CapPrm"] != eff || own["CapBnd"] != eff:
		return "the workload's permitted or bounding set is not its effective one"
	case len(blocks) < 3:
		return "fewer than two threads of the agent listed"
	}
	for i, b := range blocks {
		f := statusFields(b)
		who := "the workload"
		if i > 0 {
			who = "a thread of the agent"
		}
		switch {
		case f["CapEff"] != eff || f["CapPrm"] != eff || f["CapInh"] != eff:
			return who + " holds other capabilities than the workload's effective set"
		case strings.Trim(f["CapAmb"], "0") != "":
			return who + " has ambient capabilities"
		case f["NoNewPrivs"] != "1":
			return who + " has no no_new_privs"
		case f["Seccomp"] != "2":
			return who + " has no seccomp filter"
		}
	}
	return ""
}

// statusFields parses the "Name:\tvalue" lines of /proc/<pid>/status.
func statusFields(s string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(s, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}
