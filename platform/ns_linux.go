//go:build linux

package platform

import (
	"fmt"

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
