package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/bothy/bothy/control"
)

// TestCgroupFiles checks the reading of a cgroup's memory and OOM counters, v2 and v1 names,
// against files laid out as the kernel does.
func TestCgroupFiles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		files map[string]string
		mem   uint64
		oom   uint64
		ok    bool
	}{
		{"v2", map[string]string{"memory.current": "123456\n", "memory.events": "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n"}, 123456, 2, true},
		{"v1", map[string]string{"memory.usage_in_bytes": "777\n", "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"}, 777, 5, true},
		{"none", map[string]string{}, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for n, c := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			a, err := newAgent(Config{Capability: testCapability, CgroupDir: dir, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer a.reaper.close()
			n, ok := a.oomKills()
			if n != tc.oom || ok != tc.ok {
				t.Fatalf("oomKills = %d %v, want %d %v", n, ok, tc.oom, tc.ok)
			}
			st, err := a.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if tc.mem != 0 && st.MemoryBytes != tc.mem {
				t.Fatalf("memory %d, want %d", st.MemoryBytes, tc.mem)
			}
		})
	}
}

// TestOOMKillsOfTheWorkloads: with a workloads' cgroup of its own (cgroup v2), the OOM kills
// counted are that cgroup's, not the sandbox's, which would count a kill of the agent too;
// without a memory.events there (no memory limit), the sandbox's count stands in.
func TestOOMKillsOfTheWorkloads(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		workloads string // memory.events of the workloads' cgroup, "" for none
		want      uint64
	}{
		{"workloads' own", "low 0\nhigh 0\nmax 9\noom 3\noom_kill 3\n", 3},
		{"no memory controller", "", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sandbox, workloads := t.TempDir(), t.TempDir()
			if err := os.WriteFile(filepath.Join(sandbox, "memory.events"), []byte("max 20\noom 7\noom_kill 7\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.workloads != "" {
				if err := os.WriteFile(filepath.Join(workloads, "memory.events"), []byte(tc.workloads), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			dir, err := os.Open(workloads)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			a, err := newAgent(Config{Capability: testCapability, CgroupDir: sandbox, WorkloadCgroup: dir, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer a.reaper.close()
			if n, ok := a.oomKills(); n != tc.want || !ok {
				t.Fatalf("oomKills = %d %v, want %d true", n, ok, tc.want)
			}
		})
	}
}

// TestEndedByOOM: an OOM kill counted while an exec ran is the exec's when the exec ended as
// a SIGKILL ends a command, its own process killed or a shell's 137 for the process it waited
// for; not when it exited otherwise, timed out, or no kill was counted.
func TestEndedByOOM(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		st     control.ExitStatus
		killed bool
		want   bool
	}{
		{"its own process killed", control.ExitStatus{ExitCode: 137, Signal: "KILL"}, true, true},
		{"a shell's 137", control.ExitStatus{ExitCode: 137}, true, true},
		{"no kill counted", control.ExitStatus{ExitCode: 137, Signal: "KILL"}, false, false},
		{"exited 0 after a kill inside", control.ExitStatus{ExitCode: 0}, true, false},
		{"exited 1", control.ExitStatus{ExitCode: 1}, true, false},
		{"another signal", control.ExitStatus{ExitCode: 143, Signal: "TERM"}, true, false},
		{"timed out", control.ExitStatus{ExitCode: 137, Signal: "KILL", TimedOut: true}, true, false},
	} {
		if got := endedByOOM(tc.st, tc.killed); got != tc.want {
			t.Errorf("%s: endedByOOM(%+v, %v) = %v, want %v", tc.name, tc.st, tc.killed, got, tc.want)
		}
	}
}

func TestConfigRefused(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  Config
	}{
		{"no capability", Config{}},
		{"unknown user", Config{Capability: testCapability, Users: map[string]UserSpec{"admin": {}}}},
		{"bad default env", Config{Capability: testCapability, DefaultEnv: []string{"NOPE"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if a, err := newAgent(tc.cfg); err == nil {
				a.reaper.close()
				t.Fatal("accepted")
			}
		})
	}
}
