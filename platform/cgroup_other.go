//go:build !linux

package platform

import (
	"context"
	"os"
)

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

// Cgroup is unsupported off Linux.
type Cgroup struct{}

// CgroupVersion is unsupported off Linux.
func CgroupVersion() (int, error) { return 0, ErrUnsupported }

// OpenCgroup is unsupported off Linux.
func OpenCgroup(name string) (*Cgroup, error) {
	if err := validCgroupName(name); err != nil {
		return nil, err
	}
	return nil, ErrUnsupported
}

func (c *Cgroup) Name() string                       { return "" }
func (c *Cgroup) V2() bool                           { return false }
func (c *Cgroup) Dirs() []string                     { return nil }
func (c *Cgroup) Exists() bool                       { return false }
func (c *Cgroup) Create(l CgroupLimits) error        { return ErrUnsupported }
func (c *Cgroup) OpenDir() (*os.File, error)         { return nil, ErrUnsupported }
func (c *Cgroup) EnterThread() (func() error, error) { return nil, ErrUnsupported }
func (c *Cgroup) Pids() ([]int, error)               { return nil, ErrUnsupported }
func (c *Cgroup) Remove(ctx context.Context) error   { return ErrUnsupported }
func (c *Cgroup) OOMKilled() (bool, error)           { return false, ErrUnsupported }
func (c *Cgroup) AgentOOMKilled() (bool, error)      { return false, ErrUnsupported }
func (c *Cgroup) MemoryFailures() (uint64, error)    { return 0, ErrUnsupported }

func (c *Cgroup) PidsChild(name string, max int) (child, self *os.File, err error) {
	return nil, nil, ErrUnsupported
}
func MoveThreadTo(tasks *os.File) error { return ErrUnsupported }

// The children of a sandbox's cgroup on cgroup v2, named on every system for the runtime's
// documentation and tests.
const (
	V2AgentCgroup     = "agent"
	V2WorkloadsCgroup = "workloads"
)

func (c *Cgroup) OpenLeaf() (*os.File, error)                     { return nil, ErrUnsupported }
func (c *Cgroup) SplitV2(owner int) (*os.File, error)             { return nil, ErrUnsupported }
func (c *Cgroup) SettleV2(pid, pids int, memoryBytes int64) error { return ErrUnsupported }

func (c *Cgroup) Usage() (CgroupUsage, error) { return CgroupUsage{}, ErrUnsupported }
