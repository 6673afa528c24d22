package agent

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
)

const (
	// killWait bounds the wait for processes to vanish after SIGKILL (the kernel may take a
	// moment to tear down a large process).
	killWait = 5 * time.Second
	// pollEvery is how often a shutdown looks at /proc for processes still alive: nothing
	// notifies us of a grandchild's exit.
	pollEvery = 10 * time.Millisecond
)

// Shutdown implements control.Handler.
func (a *agent) Shutdown(ctx context.Context, grace time.Duration) error {
	a.terminate(ctx, grace)
	return nil
}

// terminate ends every process of the sandbox but the agent: TERM, up to grace for them to
// exit, then KILL. From then on no exec starts.
func (a *agent) terminate(ctx context.Context, grace time.Duration) {
	a.stopping.Store(true)
	a.signalAll(unix.SIGTERM)
	if !a.waitGone(ctx, grace) {
		a.signalAll(unix.SIGKILL)
		a.waitGone(context.Background(), killWait)
	}
}

// managed lists the live processes the agent is responsible for. As PID 1 that is every
// process of the pid namespace; as a subreaper, every descendant; otherwise (tests sharing a
// process) the trees of its own workloads. The agent itself is never included.
func (a *agent) managed() []proc {
	all := processes()
	self := os.Getpid()
	roots := map[int]bool{}
	if a.pid1 || a.reaper.all {
		roots[self] = true
	} else {
		a.mu.Lock()
		for pid := range a.workloads {
			roots[pid] = true
		}
		a.mu.Unlock()
	}
	var out []proc
	for _, p := range descendants(all, roots) {
		if p.pid != self {
			out = append(out, p)
		}
	}
	return out
}

func (a *agent) signalAll(sig unix.Signal) {
	if a.pid1 {
		// From PID 1, kill(-1) signals every process of the namespace but the caller, in one
		// step that races with no fork.
		unix.Kill(-1, sig)
		return
	}
	a.mu.Lock()
	for pid := range a.workloads {
		unix.Kill(-pid, sig)
	}
	a.mu.Unlock()
	for _, p := range a.managed() {
		unix.Kill(p.pid, sig)
	}
}

// waitGone waits until no managed process is alive, up to d; it reports whether none is.
func (a *agent) waitGone(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if len(a.managed()) == 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(pollEvery)
	}
}

// Stats implements control.Handler.
func (a *agent) Stats(ctx context.Context) (control.Stats, error) {
	procs := a.managed()
	if a.pid1 {
		// As PID 1 the agent is part of the sandbox's footprint.
		for _, p := range processes() {
			if p.pid == 1 {
				procs = append(procs, p)
			}
		}
	}
	var st control.Stats
	page := uint64(os.Getpagesize())
	var ticks uint64
	for _, p := range procs {
		st.MemoryBytes += p.rssPages * page
		ticks += p.utime + p.stime
	}
	st.Pids = len(procs)
	// /proc counts CPU in USER_HZ ticks, 100 per second on Linux.
	st.CPUUsec = ticks * 10_000
	// Add what ended processes used: as their reaper the agent accumulated it. (Outside
	// PID 1 this also counts whatever else the hosting process waited for.)
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_CHILDREN, &ru) == nil {
		st.CPUUsec += uint64(ru.Utime.Nano()/1000) + uint64(ru.Stime.Nano()/1000)
	}
	if a.cfg.CgroupDir != "" {
		// The cgroup's count includes page cache and kernel memory charged to the sandbox,
		// which is what its limit is measured against.
		for _, name := range []string{"memory.current", "memory.usage_in_bytes"} {
			if v, ok := readUint(filepath.Join(a.cfg.CgroupDir, name)); ok {
				st.MemoryBytes = v
				break
			}
		}
	}
	return st, nil
}

// oomKills reads the count of OOM kills among the workloads. On cgroup v2 with a workloads'
// cgroup of its own (Config.WorkloadCgroup) that is the cgroup's memory.events, read through
// the directory the agent holds: the agent's own cgroup is its sibling, so a kill there is
// not counted, and the count is the workloads' alone. Otherwise it is the sandbox's cgroup
// (Config.CgroupDir: v2 memory.events, v1 memory.oom_control, whose oom_kill exists since
// Linux 4.13), which on v1 holds the agent too.
func (a *agent) oomKills() (uint64, bool) {
	if a.cfg.WorkloadCgroup != nil {
		// Without a memory limit the workloads' cgroup has no memory controller, and no file.
		if b, err := readCgroupAt(a.cfg.WorkloadCgroup, "memory.events"); err == nil {
			if n, ok := oomKillCount(b); ok {
				return n, true
			}
		}
	}
	if a.cfg.CgroupDir == "" {
		return 0, false
	}
	for _, name := range []string{"memory.events", "memory.oom_control"} {
		b, err := os.ReadFile(filepath.Join(a.cfg.CgroupDir, name))
		if err != nil {
			continue
		}
		if n, ok := oomKillCount(b); ok {
			return n, true
		}
	}
	return 0, false
}

// oomKillCount finds the oom_kill line of a cgroup's flat keyed file.
func oomKillCount(b []byte) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(" "))
		if ok && string(k) == "oom_kill" {
			n, err := strconv.ParseUint(string(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// readCgroupAt reads the file name of the cgroup directory dir (a small kernel-made file).
func readCgroupAt(dir *os.File, name string) ([]byte, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 64<<10))
}

func readUint(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	return v, err == nil
}
