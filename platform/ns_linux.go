//go:build linux

package platform

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// SetHostname sets the host name of the calling process's UTS namespace.
func SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("platform: sethostname %q: %w", name, err)
	}
	return nil
}

// LoopbackUp brings the loopback interface of the calling process's network namespace up, as
// a fresh network namespace starts with it down.
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("platform: socket for loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("platform: get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("platform: bring lo up: %w", err)
	}
	return nil
}

// SetParentDeathSignal asks the kernel to send sig to the calling thread's process when the
// thread that created it exits.
func SetParentDeathSignal(sig unix.Signal) error {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(sig), 0, 0, 0); err != nil {
		return fmt.Errorf("platform: PR_SET_PDEATHSIG: %w", err)
	}
	return nil
}

// UnshareCgroupNamespace gives the process a new cgroup namespace rooted at its current
// cgroup. Namespaces are per thread: in a binary without cgo every thread moves; with cgo only
// the calling thread does (wholeProcess false), and the caller must hold runtime.LockOSThread
// and exec from that thread for the whole process to follow.
func UnshareCgroupNamespace() (wholeProcess bool, err error) {
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWCGROUP, 0, 0)
	switch errno {
	case 0:
		return true, nil
	case syscall.ENOTSUP:
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return false, fmt.Errorf("platform: unshare cgroup namespace: %w", err)
		}
		return false, nil
	}
	return false, fmt.Errorf("platform: unshare cgroup namespace: %w", errno)
}
