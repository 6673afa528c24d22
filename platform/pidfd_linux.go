//go:build linux

package platform

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// pidGone says a pidfd_open of a process's pid failed because that process is gone: no
// process has the pid (ESRCH), or a thread of another process has taken it (a pidfd names a
// thread-group leader, which every process this package identifies is; the kernel refuses a
// thread that leads none with EINVAL before Linux 6.9 and ENOENT since).
func pidGone(err error) bool {
	return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT)
}

// WaitExit blocks until the process p names has exited, or ctx ends. It works for processes
// that are not the caller's children (a pidfd becomes readable when its process exits), and
// returns at once for a process that is already gone or whose identity no longer matches.
func WaitExit(ctx context.Context, p ProcessID) error {
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if pidGone(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("platform: pidfd_open %d: %w", p.Pid, err)
	}
	// The pidfd pins whatever process holds the pid now; if that is not p, p is gone.
	if !p.Alive() {
		unix.Close(fd)
		return nil
	}
	// An os.File on the pidfd lets the runtime poller wait for readability without a thread,
	// and lets Close interrupt that wait when ctx ends.
	// The fd must be non-blocking for os.NewFile to register it with the poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(pastDeadline) })
	defer stop()
	var werr error
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, perr := unix.Poll(fds, 0)
		if perr != nil && perr != unix.EINTR {
			werr = perr
			return true
		}
		return n > 0
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	return werr
}

// pastDeadline is a deadline already passed, to interrupt a blocked wait.
var pastDeadline = time.Unix(1, 0)
