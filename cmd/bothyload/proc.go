package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ProcSample is the server's resident memory and open file descriptors at one moment.
type ProcSample struct {
	RSSKiB int `json:"rss_kib"`
	FDs    int `json:"fds"`
}

// sampleProc reads /proc/<pid>/status (VmRSS) and counts /proc/<pid>/fd.
func sampleProc(pid int) (ProcSample, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return ProcSample{}, err
	}
	var s ProcSample
	found := false
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				s.RSSKiB, err = strconv.Atoi(f[0])
				found = err == nil
			}
		}
	}
	if !found {
		return ProcSample{}, fmt.Errorf("%s/status has no VmRSS line", dir)
	}
	fds, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return ProcSample{}, err
	}
	s.FDs = len(fds)
	return s, nil
}

// procWatch samples a process periodically while the load runs and keeps the peaks.
type procWatch struct {
	pid  int
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	peak    ProcSample
	samples int
	err     error
}

func watchProc(pid int, every time.Duration) *procWatch {
	w := &procWatch{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			w.take()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *procWatch) take() {
	s, err := sampleProc(w.pid)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.err = errors.Join(w.err, err)
		return
	}
	w.samples++
	w.peak.RSSKiB = max(w.peak.RSSKiB, s.RSSKiB)
	w.peak.FDs = max(w.peak.FDs, s.FDs)
}

// end stops sampling and returns the peaks.
func (w *procWatch) end() (ProcSample, error) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.samples == 0 {
		return ProcSample{}, fmt.Errorf("no sample of pid %d: %w", w.pid, w.err)
	}
	return w.peak, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// cpuTime is the CPU time of pid and of its reaped children (user and system), from
// /proc/<pid>/stat. bothyd reaps its sandboxes' shims, and each shim its sandbox's init, so
// after a sandbox ends its CPU time is in bothyd's children's.
func cpuTime(pid int) (time.Duration, error) {
	self, children, err := cpuTimes(pid)
	return self + children, err
}

// cpuTimes is cpuTime split: pid's own (utime and stime) and its reaped children's (cutime
// and cstime).
func cpuTimes(pid int) (self, children time.Duration, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces; the fields after it are plain.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime, stime, cutime and cstime are fields 14 to 17.
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var ticks [4]int64
	for j, s := range f[11:15] {
		if ticks[j], err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	tick := time.Second / clockTicks
	return time.Duration(ticks[0]+ticks[1]) * tick, time.Duration(ticks[2]+ticks[3]) * tick, nil
}
