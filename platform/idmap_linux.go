//go:build linux

package platform

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SetMountIDMap makes the detached mount m (and the mounts below it if recursive) an
// idmapped mount (MOUNT_ATTR_IDMAP, Linux 5.12) with the id mapping of the user namespace
// userns, a descriptor of /proc/<pid>/ns/user: a file whose owner is id N on disk shows as the
// host id that userns maps N to, and a file made through m by that host id is written as N.
// The kernel allows it only on a mount that no mount namespace holds yet (a clone of
// [CloneMount], a mount of [MountDetached] or [NewMount]), that is not idmapped already, on a
// file system that supports it (ext4, xfs, btrfs, tmpfs...; not overlayfs or NFS), and only
// to a caller with CAP_SYS_ADMIN over the file system's own user namespace (host root).
// [ErrIDMapUnsupported] says that the file system does not support it.
func SetMountIDMap(m, userns *os.File, recursive bool) error {
	flags := uint(unix.AT_EMPTY_PATH)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	err := control(m, func(fd int) error {
		return control(userns, func(nsfd int) error {
			return unix.MountSetattr(fd, "", flags, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(nsfd)})
		})
	})
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("platform: idmap mount %s: %w (%w)", m.Name(), ErrIDMapUnsupported, err)
	}
	if err != nil {
		return fmt.Errorf("platform: idmap mount %s: %w", m.Name(), err)
	}
	return nil
}

// ErrIDMapUnsupported is returned by [SetMountIDMap] for a mount on which the kernel refuses
// an id mapping (EINVAL): its file system (or one below it) cannot be idmapped.
var ErrIDMapUnsupported = errors.New("the file system does not support idmapped mounts")

// AsThreadUser runs fn with the calling THREAD's effective user and group ids (and so its
// file system ids) set to uid and gid, its real and saved ids unchanged (root), and its
// effective capabilities raised again to its permitted set, which the change of ids clears;
// then it sets them back. The caller must hold runtime.LockOSThread: Go then makes new threads
// from a template thread, never from this one, so no other thread ever starts with these ids;
// fn must run on this goroutine alone.
//
// What the kernel records of its caller's credentials then names uid: the owner of a user
// namespace that a clone makes in fn (whose own count of user namespaces, inotify instances
// and processes is then uid's, not host root's), and the credentials with which an overlay
// made in fn writes its layers (files of its own, such as whiteouts, are then uid's).
func AsThreadUser(uid, gid int, fn func() error) (err error) {
	if err := setThreadIDs(unix.SYS_SETRESGID, gid); err != nil {
		return fmt.Errorf("platform: set the thread's effective group: %w", err)
	}
	defer func() {
		if rerr := setThreadIDs(unix.SYS_SETRESGID, 0); rerr != nil {
			err = errors.Join(err, fmt.Errorf("platform: restore the thread's effective group: %w", rerr))
		}
	}()
	if err := setThreadIDs(unix.SYS_SETRESUID, uid); err != nil {
		return fmt.Errorf("platform: set the thread's effective user: %w", err)
	}
	defer func() {
		// Back to 0, the kernel gives the effective set the permitted one again.
		if rerr := setThreadIDs(unix.SYS_SETRESUID, 0); rerr != nil {
			// A thread stuck as another user must not go on serving the shim.
			panic(fmt.Sprintf("platform: restore the thread's effective user: %v", rerr))
		}
	}()
	if err := raiseEffective(); err != nil {
		return err
	}
	return fn()
}

// setThreadIDs sets the calling thread's effective id (SYS_SETRESUID or SYS_SETRESGID) alone:
// Go's own setters change every thread of the process.
func setThreadIDs(trap uintptr, id int) error {
	keep := ^uintptr(0) // -1: unchanged
	if _, _, errno := unix.RawSyscall(trap, keep, uintptr(id), keep); errno != 0 {
		return errno
	}
	return nil
}

// raiseEffective sets the calling thread's effective capabilities to its permitted ones.
func raiseEffective() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, (*unix.CapUserData)(unsafe.Pointer(&data[0]))); err != nil {
		return fmt.Errorf("platform: capget: %w", err)
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, (*unix.CapUserData)(unsafe.Pointer(&data[0]))); err != nil {
		return fmt.Errorf("platform: capset: %w", err)
	}
	return nil
}

// IDRangeLock is a host-wide registry of ranges of host ids, one per slot, each held by one
// process at a time: slot n is a write lock on byte n of one file, an open file description
// lock (F_OFD_SETLK), which the kernel releases when the last descriptor of the holder's open
// file goes, by its close or its death, even by SIGKILL. Nothing needs to be released or
// reclaimed after a crash, and no two live holders ever have one slot.
type IDRangeLock struct {
	f *os.File
}

// OpenIDRangeLock opens (making it if missing, with its directory) the registry file at path,
// which must be a regular file of root's: every holder of slots on the host must name the
// same one.
func OpenIDRangeLock(path string) (*IDRangeLock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("platform: id range registry: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("platform: id range registry: %w", err)
	}
	st, err := StatOf(f)
	if err != nil || !st.Mode.IsRegular() || st.UID != 0 {
		f.Close()
		return nil, fmt.Errorf("platform: id range registry %s is not a regular file of root's (%v)", path, err)
	}
	return &IDRangeLock{f: f}, nil
}

// TryLock takes slot n if no one holds it and reports whether it did. A slot this process
// already holds through this registry is taken again (OFD locks do not conflict with
// themselves): use one registry per holder.
func (l *IDRangeLock) TryLock(n int) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(n), Len: 1}
	err := IgnoringEINTR(func() error { return unix.FcntlFlock(l.f.Fd(), unix.F_OFD_SETLK, &lk) })
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("platform: lock id range slot %d: %w", n, err)
	}
	return true, nil
}

// Held reports whether some process holds slot n, without taking it.
func (l *IDRangeLock) Held(n int) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(n), Len: 1}
	if err := unix.FcntlFlock(l.f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, fmt.Errorf("platform: look at id range slot %d: %w", n, err)
	}
	return lk.Type != unix.F_UNLCK, nil
}

// Close releases every slot taken through l (a process's death does the same).
func (l *IDRangeLock) Close() error { return l.f.Close() }

// KeepOnExec keeps the registry open, with the slots it holds, in the program an exec
// starts (keep), or lets an exec close it again.
func (l *IDRangeLock) KeepOnExec(keep bool) error { return SetCloseOnExec(l.f, !keep) }
