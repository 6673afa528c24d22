package agent

import (
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper collects the exit statuses of children. It is the only code in the agent that
// waits for children: os/exec's Wait is never used, because as PID 1 the agent must also reap
// orphans, and a wait4(-1) loop would steal statuses from a concurrent Wait.
//
// Statuses of workloads go to whoever started them; everything else (orphans re-parented to
// us) is just reaped. A workload is registered under mu in the same critical section that
// forks it, and dispatch looks it up under mu, so a child that exits before registration
// still reaches its waiter.
type reaper struct {
	all     bool
	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
	sig     chan os.Signal
	stop    chan struct{}
	done    chan struct{}
}

func newReaper(all bool) *reaper {
	r := &reaper{
		all:     all,
		waiting: make(map[int]chan unix.WaitStatus),
		sig:     make(chan os.Signal, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sig, unix.SIGCHLD)
	go r.loop()
	return r
}

// start runs fork (which starts a child and returns its pid) and registers the child. The
// returned channel yields the child's status once.
func (r *reaper) start(fork func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[pid] = ch
	return pid, ch, nil
}

func (r *reaper) close() {
	signal.Stop(r.sig)
	close(r.stop)
	<-r.done
}

func (r *reaper) loop() {
	defer close(r.done)
	for {
		select {
		case <-r.sig:
			r.reap()
		case <-r.stop:
			return
		}
	}
}

func (r *reaper) reap() {
	if r.all {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.dispatch(pid, ws)
		}
	}
	r.mu.Lock()
	pids := make([]int, 0, len(r.waiting))
	for pid := range r.waiting {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	for _, pid := range pids {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		for err == unix.EINTR {
			got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		if err == nil && got == pid {
			r.dispatch(pid, ws)
		}
	}
}

func (r *reaper) dispatch(pid int, ws unix.WaitStatus) {
	r.mu.Lock()
	ch, ok := r.waiting[pid]
	delete(r.waiting, pid)
	r.mu.Unlock()
	if ok {
		ch <- ws
	}
}
