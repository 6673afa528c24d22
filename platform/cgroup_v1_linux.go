//go:build linux

package platform

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupV1 is a cgroup on cgroup v1: one directory of its name in each of the memory, cpu and
// pids hierarchies, and one in the freezer hierarchy while it is frozen ([cgroupDriver] says
// how v1 and v2 differ).
type cgroupV1 struct {
	name string
	// byCtl maps a controller to the cgroup's directory in its hierarchy.
	byCtl map[string]string
	// freezerRoot is the freezer hierarchy's mount point, "" if it is not mounted.
	freezerRoot string
}

// newCgroupV1 is the cgroup name in the v1 hierarchies h.
func newCgroupV1(h hierarchies, name string) (*cgroupV1, error) {
	d := &cgroupV1{name: name, byCtl: map[string]string{}, freezerRoot: h.freezer}
	for _, ctl := range cgroupV1Controllers {
		p, ok := h.v1[ctl]
		if !ok {
			return nil, fmt.Errorf("platform: cgroup v1 %s hierarchy is not mounted and cgroup v2 lacks its controllers", ctl)
		}
		d.byCtl[ctl] = filepath.Join(p, name)
	}
	return d, nil
}

func (d *cgroupV1) dirs() []string {
	out := make([]string, 0, len(d.byCtl))
	for _, ctl := range cgroupV1Controllers {
		out = append(out, d.byCtl[ctl])
	}
	return out
}

func (d *cgroupV1) create(l CgroupLimits) error {
	for _, ctl := range cgroupV1Controllers {
		dir := d.byCtl[ctl]
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("platform: create cgroup: %w", err)
		}
		switch ctl {
		case "memory":
			if l.MemoryBytes > 0 {
				v := strconv.FormatInt(l.MemoryBytes, 10)
				if err := writeCgroupFile(dir, "memory.limit_in_bytes", v); err != nil {
					return err
				}
				// With swap accounting, also cap memory+swap so that swap is no way around
				// the limit.
				if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
					if err := writeCgroupFile(dir, "memory.memsw.limit_in_bytes", v); err != nil {
						return err
					}
				}
			}
		case "cpu":
			if l.VCPUs > 0 {
				if err := writeCgroupFile(dir, "cpu.cfs_period_us", strconv.Itoa(cfsPeriodMicros)); err != nil {
					return err
				}
				if err := writeCgroupFile(dir, "cpu.cfs_quota_us", strconv.Itoa(l.VCPUs*cfsPeriodMicros)); err != nil {
					return err
				}
			}
		case "pids":
			if l.Pids > 0 {
				if err := writeCgroupFile(dir, "pids.max", strconv.Itoa(l.Pids)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// killAll does nothing: v1 has no cgroup.kill.
func (d *cgroupV1) killAll() {}

func (d *cgroupV1) oomKilled() (bool, error) {
	b, err := os.ReadFile(filepath.Join(d.byCtl["memory"], "memory.oom_control"))
	if err != nil {
		return false, err
	}
	// The oom_kill counter exists since Linux 4.13.
	return keyedCounter(b, "oom_kill") > 0, nil
}

func (d *cgroupV1) memoryFailures() (uint64, error) {
	b, err := os.ReadFile(filepath.Join(d.byCtl["memory"], "memory.failcnt"))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// EnterThread moves the calling OS thread, and no other, into the cgroup (cgroup v1 only: v1
// lets the threads of one process live in different cgroups). A process that thread then
// forks is born inside the cgroup, and a cgroup namespace it creates is rooted there. The
// caller must hold runtime.LockOSThread for the whole time, and call the returned function,
// which moves the thread back to where it was, on that same thread.
//
// The thread is named by writing "0" (the writer itself) to each hierarchy's tasks file, not
// its tid: the kernel (since 6.0) moves the writing thread alone without taking
// cgroup_threadgroup_rwsem for writing, whose percpu_down_write waits for an RCU grace period
// (about 11 ms on this host, once per hierarchy that the lock is idle) when a tid is written.
// Older kernels take "0" as the writer too and pay the wait as before.
func (c *Cgroup) EnterThread() (leave func() error, err error) {
	d, ok := c.drv.(*cgroupV1)
	if !ok {
		return nil, fmt.Errorf("platform: moving one thread needs cgroup v1; use OpenDir on v2")
	}
	tid := unix.Gettid()
	prev, err := threadCgroups(tid)
	if err != nil {
		return nil, err
	}
	_, v1, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	var moved []string
	back := func() error {
		var first error
		for _, ctl := range moved {
			dir := filepath.Join(v1[ctl], prev[ctl])
			if err := writeCgroupFile(dir, "tasks", "0"); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	for _, ctl := range cgroupV1Controllers {
		if _, ok := prev[ctl]; !ok {
			_ = back()
			return nil, fmt.Errorf("platform: thread %d has no %s cgroup", tid, ctl)
		}
		if err := writeCgroupFile(d.byCtl[ctl], "tasks", "0"); err != nil {
			_ = back()
			return nil, err
		}
		moved = append(moved, ctl)
	}
	return back, nil
}

// PidsChild makes the child cgroup name of the cgroup in its pids hierarchy (cgroup v1 only),
// limited to max tasks, and opens for writing the tasks files of the child and of the cgroup
// itself. A thread that writes "0" to one of them moves itself there ([MoveThreadTo]). The
// kernel judges such a write by the credentials of the file's opener, so a process handed the
// two files can move its own threads between the two cgroups, and nowhere else, whatever it
// runs as. It is idempotent; the child goes with the cgroup ([Cgroup.Remove]).
func (c *Cgroup) PidsChild(name string, max int) (child, self *os.File, err error) {
	d, ok := c.drv.(*cgroupV1)
	if !ok {
		return nil, nil, errors.New("platform: a pids child cgroup needs cgroup v1's pids hierarchy")
	}
	dir := d.byCtl["pids"]
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || max < 1 {
		return nil, nil, fmt.Errorf("platform: pids child cgroup %q of %d tasks", name, max)
	}
	sub := filepath.Join(dir, name)
	if err := os.Mkdir(sub, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, nil, fmt.Errorf("platform: create cgroup: %w", err)
	}
	if err := writeCgroupFile(sub, "pids.max", strconv.Itoa(max)); err != nil {
		return nil, nil, err
	}
	if child, err = os.OpenFile(filepath.Join(sub, "tasks"), os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
		return nil, nil, fmt.Errorf("platform: open a cgroup's tasks: %w", err)
	}
	if self, err = os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
		child.Close()
		return nil, nil, fmt.Errorf("platform: open a cgroup's tasks: %w", err)
	}
	return child, self, nil
}

// MoveThreadTo moves the calling OS thread, and no other, into the cgroup v1 whose tasks file
// is open for writing as tasks (see [Cgroup.PidsChild]); a process it forks then is born
// there. Writing "0", the writer itself, spares the RCU wait a tid costs (see
// [Cgroup.EnterThread]). The caller holds runtime.LockOSThread.
func MoveThreadTo(tasks *os.File) error {
	err := IgnoringEINTR(func() error {
		_, err := unix.Pwrite(int(tasks.Fd()), []byte("0"), 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("platform: move a thread to %s: %w", tasks.Name(), err)
	}
	return nil
}

// The v1 freezer is a hierarchy of its own, in which bothyd keeps no cgroup while a sandbox
// runs: freeze makes one of the cgroup's name there, moves the cgroup's processes into it and
// freezes it; thaw thaws it, moves the processes back to the hierarchy's root and removes it,
// so that a freezer cgroup exists exactly while the sandbox is frozen (or a crash interrupted
// a freeze or a thaw, which the next freeze or thaw finishes).

// freezeKick is how long a v1 freeze waits for FROZEN before it asks the tasks again.
const freezeKick = 250 * time.Millisecond

// freezerDir returns the cgroup's directory in the v1 freezer hierarchy.
func (d *cgroupV1) freezerDir() (string, error) {
	if d.freezerRoot == "" {
		return "", errors.New("platform: the cgroup v1 freezer hierarchy is not mounted, so sandboxes cannot be paused")
	}
	return filepath.Join(d.freezerRoot, d.name), nil
}

func (d *cgroupV1) frozen() (bool, error) {
	dir, err := d.freezerDir()
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) != "THAWED", nil
}

func (d *cgroupV1) freeze(ctx context.Context) error {
	dir, err := d.freezerDir()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("platform: create freezer cgroup: %w", err)
	}
	// A process forked by one not yet moved is missed by a pass; pass again until a pass
	// moves nothing, then freeze, and make sure nothing escaped meanwhile.
	for {
		if err := d.moveInto(ctx, dir); err != nil {
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
		outside, err := d.outside(dir)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(outside, func(pid int) bool { return platformPidAlive(pid) }) {
			return nil
		}
	}
}

func (d *cgroupV1) thaw(ctx context.Context) error {
	dir, err := d.freezerDir()
	if err != nil {
		return err
	}
	root := d.freezerRoot
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

// moveInto moves the cgroup's processes into the freezer cgroup dir until none is left out. A
// process that exits meanwhile (ESRCH) may still be listed for a moment; it is not waited for.
func (d *cgroupV1) moveInto(ctx context.Context, dir string) error {
	gone := map[int]bool{}
	for {
		outside, err := d.outside(dir)
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

// outside lists the cgroup's processes that are not in the freezer cgroup dir.
func (d *cgroupV1) outside(dir string) ([]int, error) {
	pids, err := procsOf(d.dirs())
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

// clockTick is the unit of /proc/<pid>/stat's CPU times: USER_HZ, 100 on every Linux
// architecture bothyd runs on (sysconf(_SC_CLK_TCK) answers it from the same constant).
const clockTick = 10 * time.Millisecond

// usage reads the memory and pids hierarchies' files, and the CPU time from cpuacct.usage
// where cpuacct is mounted with cpu, else from the members' /proc stat.
func (d *cgroupV1) usage() (CgroupUsage, error) {
	var u CgroupUsage
	mem, err := os.ReadFile(filepath.Join(d.byCtl["memory"], "memory.usage_in_bytes"))
	if err != nil {
		return u, err
	}
	if u.MemoryBytes, err = strconv.ParseInt(strings.TrimSpace(string(mem)), 10, 64); err != nil {
		return u, fmt.Errorf("platform: cgroup memory.usage_in_bytes: %w", err)
	}
	if peak, err := readCgroupInt(d.byCtl["memory"], "memory.max_usage_in_bytes"); err == nil {
		u.MemoryPeakBytes, u.HasMemoryPeak = peak, true
	}
	if u.MemoryLimitBytes, err = readCgroupInt(d.byCtl["memory"], "memory.limit_in_bytes"); err != nil {
		return u, err
	}
	// v1 says "no limit" with the largest page-aligned number.
	if u.MemoryLimitBytes >= 1<<62 {
		u.MemoryLimitBytes = 0
	}
	if u.Pids, err = readCgroupInt(d.byCtl["pids"], "pids.current"); err != nil {
		return u, err
	}
	if ns, err := readCgroupInt(d.byCtl["cpu"], "cpuacct.usage"); err == nil {
		u.CPU = time.Duration(ns)
		return u, nil
	}
	u.CPUApproximate = true
	pids, err := procsOf(d.dirs())
	if err != nil {
		return u, err
	}
	var ticks uint64
	for _, pid := range pids {
		if st, err := readStat(pid); err == nil { // one that exited meanwhile counts no more
			ticks += st.CPUTicks
		}
	}
	u.CPU = time.Duration(ticks) * clockTick
	return u, nil
}
