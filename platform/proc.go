package platform

import "fmt"

// ProcessID names one process for its whole life: a pid alone is reused by the kernel, so the
// pid is paired with the process's start time (field 22 of /proc/<pid>/stat, in clock ticks
// since boot) and the boot id of the kernel that ran it. Two ProcessIDs are the same process
// exactly when all three fields are equal.
type ProcessID struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	BootID    string `json:"boot_id"`
}

func (p ProcessID) String() string {
	return fmt.Sprintf("pid %d (start %d, boot %s)", p.Pid, p.StartTime, p.BootID)
}

// IsZero reports whether p names no process.
func (p ProcessID) IsZero() bool { return p == ProcessID{} }
