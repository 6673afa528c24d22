package platform

import (
	"fmt"
	"strings"
	"time"
)

// CgroupLimits are the resource limits of one cgroup. A zero field means "no limit".
type CgroupLimits struct {
	// MemoryBytes caps memory (and, on v1 with swap accounting, memory plus swap).
	MemoryBytes int64
	// VCPUs is the CPU quota in whole CPUs: VCPUs × period per period.
	VCPUs int
	// Pids caps the number of tasks (processes and threads).
	Pids int
}

// validCgroupName checks that name is a relative path of components made of [a-z0-9._-],
// none of them "." or "..", so that it cannot leave the cgroup hierarchy.
func validCgroupName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("platform: cgroup name %q must be 1-255 characters", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." {
			return fmt.Errorf("platform: cgroup name %q has an empty, . or .. component", name)
		}
		for _, r := range part {
			ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
			if !ok {
				return fmt.Errorf("platform: cgroup name %q has a character outside [a-z0-9._-]", name)
			}
		}
	}
	return nil
}

// CgroupUsage is what a cgroup (with its children) has used, read from its controllers'
// files. A field the kernel does not offer on this host is zero, and its Has flag false.
type CgroupUsage struct {
	// CPU is the CPU time used since the cgroup was made.
	CPU time.Duration
	// CPUApproximate says CPU was summed from the cgroup's live processes (and the children
	// they reaped), as on a cgroup v1 host whose cpuacct hierarchy is not the cpu one's: the
	// time of a process reaped outside the cgroup is missing.
	CPUApproximate bool
	// MemoryBytes is the memory charged now; MemoryLimitBytes the limit (0: none);
	// MemoryPeakBytes the most ever charged, when HasMemoryPeak (v2 memory.peak is Linux 5.19+).
	MemoryBytes, MemoryLimitBytes, MemoryPeakBytes int64
	HasMemoryPeak                                  bool
	// Pids is the number of tasks now.
	Pids int64
}
