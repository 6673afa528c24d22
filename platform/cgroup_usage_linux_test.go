//go:build linux

package platform

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Usage against fake cgroup trees of both versions (see fakeTree): each driver reads its own
// files, and a file the kernel may lack (memory.peak, cpuacct.usage) is optional.
func TestCgroupUsage(t *testing.T) {
	t.Parallel()
	t.Run("v2", func(t *testing.T) {
		t.Parallel()
		root := fakeTree(t, map[string]string{
			"bothy/sb/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
			"bothy/sb/memory.current": "1048576\n",
			"bothy/sb/memory.max":     "268435456\n",
			"bothy/sb/memory.peak":    "2097152\n",
			"bothy/sb/pids.current":   "7\n",
		})
		u, err := fakeCgroupV2(root, "bothy/sb").Usage()
		if err != nil {
			t.Fatal(err)
		}
		want := CgroupUsage{CPU: 2500 * time.Millisecond, MemoryBytes: 1 << 20, MemoryLimitBytes: 256 << 20, MemoryPeakBytes: 2 << 20, HasMemoryPeak: true, Pids: 7}
		if u != want {
			t.Fatalf("got %+v, want %+v", u, want)
		}
	})
	t.Run("v2 without memory.peak or a limit", func(t *testing.T) {
		t.Parallel()
		root := fakeTree(t, map[string]string{
			"sb/cpu.stat":       "usage_usec 10\n",
			"sb/memory.current": "4096\n",
			"sb/memory.max":     "max\n",
			"sb/pids.current":   "1\n",
		})
		u, err := fakeCgroupV2(root, "sb").Usage()
		if err != nil {
			t.Fatal(err)
		}
		if u.HasMemoryPeak || u.MemoryLimitBytes != 0 || u.MemoryBytes != 4096 || u.CPU != 10*time.Microsecond {
			t.Fatalf("got %+v", u)
		}
	})
	v1 := func(t *testing.T, files map[string]string) *Cgroup {
		root := fakeTree(t, files)
		h := hierarchies{v1: map[string]string{}}
		for _, ctl := range cgroupV1Controllers {
			h.v1[ctl] = filepath.Join(root, ctl)
		}
		d, err := newCgroupV1(h, "sb")
		if err != nil {
			t.Fatal(err)
		}
		return &Cgroup{name: "sb", drv: d}
	}
	t.Run("v1 with cpuacct on the cpu hierarchy", func(t *testing.T) {
		t.Parallel()
		cg := v1(t, map[string]string{
			"memory/sb/memory.usage_in_bytes":     "8192\n",
			"memory/sb/memory.max_usage_in_bytes": "16384\n",
			"memory/sb/memory.limit_in_bytes":     "9223372036854771712\n", // v1's "no limit"
			"pids/sb/pids.current":                "3\n",
			"cpu/sb/cpuacct.usage":                "1500000000\n",
		})
		u, err := cg.Usage()
		if err != nil {
			t.Fatal(err)
		}
		want := CgroupUsage{CPU: 1500 * time.Millisecond, MemoryBytes: 8192, MemoryPeakBytes: 16384, HasMemoryPeak: true, Pids: 3}
		if u != want {
			t.Fatalf("got %+v, want %+v", u, want)
		}
	})
	t.Run("v1 without cpuacct sums its members", func(t *testing.T) {
		t.Parallel()
		self := strconv.Itoa(os.Getpid())
		cg := v1(t, map[string]string{
			"memory/sb/memory.usage_in_bytes": "8192\n",
			"memory/sb/memory.limit_in_bytes": "1048576\n",
			"pids/sb/pids.current":            "1\n",
			"pids/sb/cgroup.procs":            self + "\n",
		})
		// Spend a little CPU, so that this process has more than zero ticks.
		for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
		}
		u, err := cg.Usage()
		if err != nil {
			t.Fatal(err)
		}
		if !u.CPUApproximate || u.CPU <= 0 || u.MemoryLimitBytes != 1<<20 {
			t.Fatalf("got %+v", u)
		}
	})
}
