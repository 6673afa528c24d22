//go:build linux

package platform

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The cgroup freezer, for pausing a sandbox and for the freeze of a running capture. Each
// cgroup version freezes its own way ([cgroupDriver]): v2 by cgroup.freeze, v1 by a freezer
// hierarchy of its own.

// freezePoll is how often a freeze in progress is looked at.
const freezePoll = 2 * time.Millisecond

// FreezerSupport says why this host cannot freeze cgroups, or nil if it can.
func FreezerSupport() error {
	h, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	v, err := CgroupVersion()
	if err != nil {
		return err
	}
	if v == 2 || h.freezer != "" {
		return nil
	}
	return errors.New("platform: the cgroup v1 freezer hierarchy is not mounted, so sandboxes cannot be paused")
}

// Frozen reports whether the cgroup is frozen, or being frozen.
func (c *Cgroup) Frozen() (bool, error) { return c.drv.frozen() }

// Freeze freezes every process of the cgroup and waits until they are frozen or ctx ends.
// It is idempotent.
func (c *Cgroup) Freeze(ctx context.Context) error { return c.drv.freeze(ctx) }

// Thaw thaws the cgroup's processes. It is idempotent, and a cgroup that was never frozen is
// thawed already.
func (c *Cgroup) Thaw(ctx context.Context) error { return c.drv.thaw(ctx) }

// moveProc moves pid into the cgroup dir; ESRCH says it exited meanwhile.
func moveProc(dir string, pid int) error {
	return writeCgroupFile(dir, "cgroup.procs", strconv.Itoa(pid))
}

func readProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// platformPidAlive reports whether pid names a process that has not exited (a zombie has).
func platformPidAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// waitCgroup polls done until it reports true, fails, or ctx ends.
func waitCgroup(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("platform: cgroup freezer: %w", ctx.Err())
		case <-time.After(freezePoll):
		}
	}
}
