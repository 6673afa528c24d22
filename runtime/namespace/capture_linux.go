//go:build linux

package namespace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
	"golang.org/x/sys/unix"
)

// The capture of a running sandbox. Without a disk of its own, a sandbox's upper directory
// lies in its state directory on the host, where the overlay writes straight through: frozen,
// the sandbox writes nothing, and the capture reads the live directory. With a disk of its
// own, the upper lies on an ext4 file system that only the sandbox's overlay has mounted, and
// whose newest writes may still be in memory; a second mount of the live image would read it
// torn, and replaying its journal would write under the live mount. So the frozen sandbox's
// file system is synced (syncfs through the overlay, which syncs its upper file system and
// the loop device's backing image), the image is copied (sparse, its holes kept) into a file
// with no name, and the capture reads a mount of that copy. The copy lives as long as the
// returned descriptor does: a crash leaves nothing of it behind.
var _ runtime.LiveLayerer = (*Runtime)(nil)

// OpenLiveLayer implements runtime.LiveLayerer.
func (r *Runtime) OpenLiveLayer(ctx context.Context, sandboxID, dir string, disk bool) (*os.File, bool, error) {
	if !disk {
		f, err := r.OpenLayer(dir, false)
		return f, false, err
	}
	f, err := r.snapshotDiskLayer(dir)
	return f, true, err
}

func (r *Runtime) snapshotDiskLayer(dir string) (*os.File, error) {
	if err := r.syncSandbox(dir); err != nil {
		return nil, err
	}
	img, err := platform.OpenFile(filepath.Join(dir, shim.EntryDiskImage), os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	snap, err := os.OpenFile(dir, os.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("namespace: a file for the snapshot of the disk: %w", err)
	}
	defer snap.Close() // the loop device holds it from here
	if err := copySparse(snap, img); err != nil {
		return nil, fmt.Errorf("namespace: copying the disk of a running sandbox: %w", err)
	}
	dev, err := platform.AttachLoopFile(snap)
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	// Read only for the capture's reads; the mount replays the copy's journal into the copy.
	mnt, err := platform.MountDetached("ext4", dev.Name(), unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, err
	}
	defer mnt.Close()
	return platform.OpenDirAt(mnt, shim.EntryUpper)
}

// syncSandbox syncs the file system of the sandbox in dir through its init's root, which is
// its overlay: overlayfs's syncfs syncs its upper file system.
func (r *Runtime) syncSandbox(dir string) error {
	procs, err := r.Processes(filepath.Dir(dir))
	if err != nil {
		return err
	}
	for _, p := range procs {
		if p.Role != runtime.RoleInit || p.Dir != dir {
			continue
		}
		root, err := os.Open("/proc/" + strconv.Itoa(p.ID.Pid) + "/root")
		if err != nil && !p.ID.Alive() {
			return errInitEnded
		}
		if err != nil {
			return err
		}
		defer root.Close()
		if !p.ID.Alive() {
			return errInitEnded
		}
		return unix.Syncfs(int(root.Fd()))
	}
	return errInitEnded
}

// errInitEnded is why a running capture cannot go on when the sandbox's init ended under it
// (killed, or its workload ended the sandbox): the sandbox is no longer running, which is the
// caller's to retry, not a fault of the server's.
var errInitEnded = errcode.New(errcode.NotRunning, "The sandbox stopped during its capture (its init ended); capture it again now that it is stopped, or start it first.")

// copySparse copies src into the empty dst, data extent by data extent, so that the holes of
// a sparse image stay holes (and a copy within one file system may share its blocks).
func copySparse(dst, src *os.File) error {
	st, err := src.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if err := copyRange(dst, src, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return dst.Truncate(size)
}

// copyRange copies n bytes at off of src to the same offset of dst: copy_file_range where
// the file systems allow it, read and write where they do not.
func copyRange(dst, src *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				_, err = io.Copy(io.NewOffsetWriter(dst, off), io.NewSectionReader(src, off, n))
			}
			return err
		}
		if c == 0 {
			return io.ErrUnexpectedEOF
		}
		off, n = off+int64(c), n-int64(c)
	}
	return nil
}
