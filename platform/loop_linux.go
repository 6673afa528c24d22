//go:build linux

package platform

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// LoopControl is the loop devices' control node.
const LoopControl = "/dev/loop-control"

// AttachLoop binds the image file to a free loop device and returns the device's path. The
// device clears itself (LO_FLAGS_AUTOCLEAR) once nothing holds it: whoever mounts it must do
// so before closing the returned file, and from then on the mount alone keeps it, so that a
// mount that goes (its mount namespace ending with the sandbox, whatever killed it) frees the
// device too, and no loop device outlives what uses it. The caller closes the file.
func AttachLoop(image string) (*os.File, error) {
	backing, err := OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer backing.Close()
	return AttachLoopFile(backing)
}

// AttachLoopFile is [AttachLoop] of an open image file (one opened read and write), which
// may have no name (O_TMPFILE); the device holds its own reference to it.
func AttachLoopFile(backing *os.File) (*os.File, error) {
	image := backing.Name()
	ctl, err := os.OpenFile(LoopControl, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("platform: open %s: %w", LoopControl, err)
	}
	defer ctl.Close()
	// Another process may take the free device between GET_FREE and CONFIGURE (EBUSY): ask
	// again for a few rounds.
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("platform: no free loop device: %w", err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		dev, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("platform: open %s: %w", path, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) || attempt == 20 {
			return nil, fmt.Errorf("platform: configure %s on %s: %w", path, image, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// OpenForWriting reports whether f's file is open for writing anywhere on the host, by a
// process or by the kernel on one's behalf: a loop device bound to an image holds it open read
// and write until the device is cleared, which is after the last superblock on it has gone.
// It asks the kernel by taking a read lease (F_SETLEASE), which is refused while the file is
// open for writing, and drops the lease at once: two system calls, where listing the loop
// devices reads a file of each. f must be open read-only. Where leases are not served
// (fs.leases-enable = 0, a file system without them) it returns the error, and the caller
// must find out some other way.
func OpenForWriting(f *os.File) (bool, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return false, err
	}
	var leaseErr error
	if err := rc.Control(func(fd uintptr) {
		if _, leaseErr = unix.FcntlInt(fd, unix.F_SETLEASE, unix.F_RDLCK); leaseErr == nil {
			_, leaseErr = unix.FcntlInt(fd, unix.F_SETLEASE, unix.F_UNLCK)
		}
	}); err != nil {
		return false, err
	}
	switch {
	case leaseErr == nil:
		return false, nil
	case errors.Is(leaseErr, unix.EAGAIN):
		return true, nil
	default:
		return false, fmt.Errorf("platform: a lease on %s: %w", f.Name(), leaseErr)
	}
}

// LoopBackingFiles lists the backing files of the host's attached loop devices, by device
// name, as the kernel reports them.
func LoopBackingFiles() (map[string]string, error) {
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile("/sys/block/" + e.Name() + "/loop/backing_file")
		if err != nil {
			continue // not a loop device, or not attached
		}
		out[e.Name()] = strings.TrimSuffix(string(b), "\n")
	}
	return out, nil
}
