package agent

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair. It does what creack/pty does, but keeps the master
// non-blocking so that Go's poller serves it: reads then honour deadlines and Close, which
// the output drain relies on (creack/pty's ioctls switch the file to blocking mode). The slave
// is opened through the master (TIOCGPTPEER) where the kernel has it, so no /dev/pts path
// lookup is needed inside a sandbox.
func openPTY() (master, slave *os.File, err error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, nil, fmt.Errorf("unlocking the pty: %w", err)
	}
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	sfd := int(r)
	if errno != 0 {
		// Older kernels: open the slave by name.
		n, nerr := unix.IoctlGetInt(mfd, unix.TIOCGPTN)
		if nerr != nil {
			unix.Close(mfd)
			return nil, nil, fmt.Errorf("finding the pty: %w", nerr)
		}
		sfd, err = unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(mfd)
			return nil, nil, err
		}
	}
	return os.NewFile(uintptr(mfd), "/dev/ptmx"), os.NewFile(uintptr(sfd), "pty"), nil
}

func setWinsize(f *os.File, rows, cols uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	err = rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
	if err != nil {
		return err
	}
	return ierr
}
