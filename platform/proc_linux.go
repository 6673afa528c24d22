//go:build linux

package platform

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrProcessGone means the process named by a ProcessID no longer runs: its pid is free, or
// now belongs to another process, or it is a zombie waiting to be reaped.
var ErrProcessGone = errors.New("platform: process is gone")

// procStat is what bothyd needs from /proc/<pid>/stat.
type procStat struct {
	State     byte
	PPid      int
	StartTime uint64
	// CPUTicks is utime, stime, cutime and cstime (fields 14-17) added: the CPU time, in
	// clock ticks, of the process and of the children it reaped.
	CPUTicks uint64
}

// parseStat parses the contents of /proc/<pid>/stat. The second field (comm) is the
// executable name in parentheses and may itself contain spaces and parentheses, so the fields
// after it are located from the LAST closing parenthesis, which the kernel guarantees ends
// comm.
func parseStat(b []byte) (procStat, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 || end+2 > len(b) {
		return procStat{}, fmt.Errorf("platform: malformed stat line %q", b)
	}
	// Fields from 3 (state) onward, space separated.
	fields := bytes.Fields(b[end+1:])
	// Field 22 (starttime) is index 22-3 = 19 in fields.
	if len(fields) < 20 {
		return procStat{}, fmt.Errorf("platform: stat line has %d fields after comm, want at least 20", len(fields))
	}
	if len(fields[0]) != 1 {
		return procStat{}, fmt.Errorf("platform: malformed process state %q", fields[0])
	}
	ppid, err := strconv.Atoi(string(fields[1]))
	if err != nil {
		return procStat{}, fmt.Errorf("platform: malformed ppid: %w", err)
	}
	start, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("platform: malformed start time: %w", err)
	}
	var ticks uint64
	for _, f := range fields[11:15] { // utime, stime, cutime, cstime
		n, err := strconv.ParseInt(string(f), 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("platform: malformed CPU time: %w", err)
		}
		if n > 0 {
			ticks += uint64(n)
		}
	}
	return procStat{State: fields[0][0], PPid: ppid, StartTime: start, CPUTicks: ticks}, nil
}

func readStat(pid int) (procStat, error) {
	if pid <= 0 {
		return procStat{}, fmt.Errorf("platform: invalid pid %d", pid)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return procStat{}, fmt.Errorf("%w: pid %d", ErrProcessGone, pid)
		}
		return procStat{}, err
	}
	return parseStat(b)
}

// Identify returns the identity of the running process pid. A zombie counts as gone.
func Identify(pid int) (ProcessID, error) {
	st, err := readStat(pid)
	if err != nil {
		return ProcessID{}, err
	}
	if st.State == 'Z' || st.State == 'X' {
		return ProcessID{}, fmt.Errorf("%w: pid %d has exited", ErrProcessGone, pid)
	}
	boot, err := BootID()
	if err != nil {
		return ProcessID{}, err
	}
	return ProcessID{Pid: pid, StartTime: st.StartTime, BootID: boot}, nil
}

// ParentPid returns the parent pid of the process pid, as seen from this pid namespace.
func ParentPid(pid int) (int, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return st.PPid, nil
}

// Alive reports whether the process p names still runs: same boot, the pid exists, is not a
// zombie, and has the recorded start time.
func (p ProcessID) Alive() bool {
	if p.Pid <= 0 {
		return false
	}
	cur, err := Identify(p.Pid)
	return err == nil && cur == p
}

// SignalVerified sends sig to the process p names, and to no other. It opens a pidfd first,
// which pins the process, then checks the identity, then signals through the pidfd: a pid
// reused between the check and the signal cannot receive it. It returns ErrProcessGone if the
// process no longer runs.
func SignalVerified(p ProcessID, sig syscall.Signal) error {
	if p.Pid <= 0 {
		return fmt.Errorf("platform: invalid pid %d", p.Pid)
	}
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if err != nil {
		if pidGone(err) {
			return fmt.Errorf("%w: %s", ErrProcessGone, p)
		}
		return fmt.Errorf("platform: pidfd_open %d: %w", p.Pid, err)
	}
	defer unix.Close(fd)
	// The pidfd refers to whatever process held the pid when it was opened; the identity check
	// now tells whether that is the process we mean.
	if !p.Alive() {
		return fmt.Errorf("%w: %s", ErrProcessGone, p)
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("%w: %s", ErrProcessGone, p)
		}
		return fmt.Errorf("platform: signal %s: %w", p, err)
	}
	return nil
}

// Children returns the pids of the processes whose parent is pid: from the kernel's
// per-task children lists (/proc/<pid>/task/<tid>/children) where the kernel has them
// (CONFIG_PROC_CHILDREN), else by scanning all of /proc. The lists cost a read per thread of
// pid; the scan reads the stat of every process of the host, which made a forced stop slower
// the more processes (sandboxes) the host ran. Either answer is a snapshot: a caller that must
// catch a child forked after it, as a kill does, asks again.
func Children(pid int) ([]int, error) {
	if kids, err := taskChildren(pid); !errors.Is(err, errNoChildrenLists) {
		return kids, err
	}
	return scanChildren(pid)
}

// errNoChildrenLists says the kernel keeps no per-task children lists.
var errNoChildrenLists = errors.New("platform: no /proc/<pid>/task/<tid>/children")

// taskChildren reads the children lists of every thread of pid.
func taskChildren(pid int) ([]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return nil, nil // pid is gone, and with it its children's parenthood
	}
	if err != nil {
		return nil, err
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		switch {
		case errors.Is(err, os.ErrNotExist):
			if _, serr := os.Stat(fmt.Sprintf("/proc/%d/task/%s", pid, t.Name())); serr == nil {
				return nil, errNoChildrenLists
			}
			continue // the thread ended since the listing
		case errors.Is(err, unix.ESRCH):
			// The thread is ending (an exit, or an execve of another thread, as a shim's
			// shed of its set-up makes: the kernel ends every other thread); its children
			// go to a thread that stays, which this or the caller's next look reads.
			continue
		case err != nil:
			return nil, err
		}
		for _, f := range strings.Fields(string(b)) {
			if child, err := strconv.Atoi(f); err == nil {
				out = append(out, child)
			}
		}
	}
	return out, nil
}

// scanChildren finds the children of pid by reading the stat of every process.
func scanChildren(pid int) ([]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, n := range names {
		child, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		st, err := readStat(child)
		if err != nil {
			continue
		}
		if st.PPid == pid {
			out = append(out, child)
		}
	}
	return out, nil
}

// SignalChildren sends sig to every child of the live process parent. Each child is pinned
// with a pidfd and then checked to still be parent's child, so that a pid freed and reused
// between the scan and the signal is never signalled. It returns how many it signalled.
func SignalChildren(parent ProcessID, sig syscall.Signal) (int, error) {
	return SignalChildrenExcept(parent, sig, nil)
}

// SignalChildrenExcept is SignalChildren for the children that skip, unless nil, does not
// pick out by pid.
func SignalChildrenExcept(parent ProcessID, sig syscall.Signal, skip func(pid int) bool) (int, error) {
	if !parent.Alive() {
		return 0, fmt.Errorf("%w: %s", ErrProcessGone, parent)
	}
	kids, err := Children(parent.Pid)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, kid := range kids {
		fd, err := unix.PidfdOpen(kid, 0)
		if err != nil {
			continue
		}
		if skip != nil && skip(kid) {
			unix.Close(fd)
			continue
		}
		st, err := readStat(kid)
		if err == nil && st.PPid == parent.Pid && parent.Alive() {
			if unix.PidfdSendSignal(fd, sig, nil, 0) == nil {
				n++
			}
		}
		unix.Close(fd)
	}
	return n, nil
}

// SetOOMScoreAdj writes score to the oom_score_adj of the process pid (-1000 to 1000): the
// OOM killer weighs each process by its memory plus score thousandths of the memory it may
// use, and never kills one at -1000. Each process also has a least score, inherited at fork
// (0 from the host's init): a write by a process with CAP_SYS_RESOURCE in the host's user
// namespace sets both, and any other writer that may write the file can set any score down
// to the least, never below. A process that is gone answers ESRCH.
func SetOOMScoreAdj(pid, score int) error {
	if score < -1000 || score > 1000 {
		return fmt.Errorf("platform: oom_score_adj %d is outside -1000 to 1000", score)
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("platform: oom_score_adj of %d: %w", pid, err)
	}
	_, err = f.WriteString(strconv.Itoa(score))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("platform: set oom_score_adj of %d to %d: %w", pid, score, err)
	}
	return nil
}
