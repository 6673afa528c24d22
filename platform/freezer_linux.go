//go:build linux

package platform

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The cgroup freezer, for pausing a sandbox. On cgroup v2 every cgroup has cgroup.freeze. On
// v1 the freezer is a hierarchy of its own, in which bothyd keeps no cgroup while a sandbox
// runs: Freeze makes one of the cgroup's name there, moves the cgroup's processes into it and
// freezes it; Thaw thaws it, moves the processes back to the hierarchy's root and removes it,
// so that a freezer cgroup exists exactly while the sandbox is frozen (or a crash interrupted
// a freeze or a thaw, which the next Freeze or Thaw finishes).

// freezePoll is how often a freeze in progress is looked at.
const freezePoll = 2 * time.Millisecond

// freezeKick is how long a v1 freeze waits for FROZEN before it asks the tasks again.
const freezeKick = 250 * time.Millisecond

// freezerV1Root returns the mount point of the v1 freezer hierarchy.
func freezerV1Root() (string, error) {
	h, err := cgroupHierarchies()
	if err != nil {
		return "", err
	}
	if h.freezer != "" {
		return h.freezer, nil
	}
	return "", errors.New("platform: the cgroup v1 freezer hierarchy is not mounted, so sandboxes cannot be paused")
}

// FreezerSupport says why this host cannot freeze cgroups, or nil if it can.
func FreezerSupport() error {
	v, err := CgroupVersion()
	if err != nil {
		return err
	}
	if v == 2 {
		return nil
	}
	_, err = freezerV1Root()
	return err
}

// Frozen reports whether the cgroup is frozen, or being frozen.
func (c *Cgroup) Frozen() (bool, error) {
	if c.v2 {
		b, err := os.ReadFile(filepath.Join(c.dirs[""], "cgroup.freeze"))
		if err != nil {
			return false, err
		}
		return strings.TrimSpace(string(b)) == "1", nil
	}
	root, err := freezerV1Root()
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile(filepath.Join(root, c.name, "freezer.state"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) != "THAWED", nil
}

// Freeze freezes every process of the cgroup and waits until they are frozen or ctx ends.
// It is idempotent.
func (c *Cgroup) Freeze(ctx context.Context) error {
	if c.v2 {
		dir := c.dirs[""]
		if err := writeCgroupFile(dir, "cgroup.freeze", "1"); err != nil {
			return err
		}
		return waitCgroup(ctx, func() (bool, error) {
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
			return keyedCounter(b, "frozen") == 1, err
		})
	}
	root, err := freezerV1Root()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, c.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("platform: create freezer cgroup: %w", err)
	}
	// A process forked by one not yet moved is missed by a pass; pass again until a pass
	// moves nothing, then freeze, and make sure nothing escaped meanwhile.
	for {
		if err := c.moveV1(ctx, dir); err != nil {
			return err
		}
		if err := writeCgroupFile(dir, "freezer.state", "FROZEN"); err != nil {
			return err
		}
		kicked := time.Now()
		if err := waitCgroup(ctx, func() (bool, error) {
			b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
			if err != nil || strings.TrimSpace(string(b)) == "FROZEN" {
				return err == nil, err
			}
			// Still FREEZING: ask again, which wakes every task not frozen yet to freeze. A task
			// that missed the first wake-up would otherwise hold the cgroup FREEZING until the
			// caller gives up.
			if time.Since(kicked) >= freezeKick {
				kicked = time.Now()
				return false, writeCgroupFile(dir, "freezer.state", "FROZEN")
			}
			return false, nil
		}); err != nil {
			return fmt.Errorf("%w (%s)", err, unfrozenV1(dir))
		}
		outside, err := c.outsideV1(dir)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(outside, func(pid int) bool { return platformPidAlive(pid) }) {
			return nil
		}
	}
}

// Thaw thaws the cgroup's processes. It is idempotent, and a cgroup that was never frozen is
// thawed already.
func (c *Cgroup) Thaw(ctx context.Context) error {
	if c.v2 {
		dir := c.dirs[""]
		if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err := writeCgroupFile(dir, "cgroup.freeze", "0"); err != nil {
			return err
		}
		return waitCgroup(ctx, func() (bool, error) {
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
			return keyedCounter(b, "frozen") == 0, err
		})
	}
	root, err := freezerV1Root()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, c.name)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := writeCgroupFile(dir, "freezer.state", "THAWED"); err != nil {
		return err
	}
	return waitCgroup(ctx, func() (bool, error) {
		pids, err := readProcs(dir)
		if err != nil {
			return false, err
		}
		for _, pid := range pids {
			_ = moveProc(root, pid) // one that exited meanwhile leaves by itself
		}
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return true, nil
		}
		if errors.Is(err, unix.EBUSY) {
			return false, nil
		}
		return false, err
	})
}

// unfrozenV1 describes a v1 freezer cgroup that is not frozen: its state and each of its tasks
// that is not frozen, with its state and where it waits in the kernel.
func unfrozenV1(dir string) string {
	state, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
	b, _ := os.ReadFile(filepath.Join(dir, "tasks"))
	var tasks []string
	for _, f := range strings.Fields(string(b)) {
		stat, _ := os.ReadFile("/proc/" + f + "/stat")
		wchan, _ := os.ReadFile("/proc/" + f + "/wchan")
		st := string(stat)
		if i := strings.LastIndexByte(st, ')'); i >= 0 && i+2 < len(st) {
			st = st[:min(len(st), i+3)]
		}
		tasks = append(tasks, fmt.Sprintf("%s %s wchan %s", f, st, wchan))
	}
	return fmt.Sprintf("freezer.state %s; tasks: %s", strings.TrimSpace(string(state)), strings.Join(tasks, "; "))
}

// moveV1 moves the cgroup's processes into the freezer cgroup dir until none is left out. A
// process that exits meanwhile (ESRCH) may still be listed for a moment; it is not waited for.
func (c *Cgroup) moveV1(ctx context.Context, dir string) error {
	gone := map[int]bool{}
	for {
		outside, err := c.outsideV1(dir)
		if err != nil {
			return err
		}
		outside = slices.DeleteFunc(outside, func(pid int) bool { return gone[pid] })
		if len(outside) == 0 {
			return nil
		}
		for _, pid := range outside {
			if err := moveProc(dir, pid); errors.Is(err, unix.ESRCH) {
				gone[pid] = true
			} else if err != nil {
				return err
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// outsideV1 lists the cgroup's processes that are not in the freezer cgroup dir.
func (c *Cgroup) outsideV1(dir string) ([]int, error) {
	pids, err := c.Pids()
	if err != nil {
		return nil, err
	}
	in, err := readProcs(dir)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, pid := range pids {
		if !slices.Contains(in, pid) {
			out = append(out, pid)
		}
	}
	return out, nil
}

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
