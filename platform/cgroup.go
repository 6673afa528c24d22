package platform

import (
	"fmt"
	"strings"
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
