package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
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
