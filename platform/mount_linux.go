//go:build linux

package platform

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount wraps mount(2) with an error that names what failed.
func Mount(source, target, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("platform: mount %s on %s (type %q, data %q): %w", source, target, fstype, data, err)
	}
	return nil
}

// MountDetached mounts the file system of type fstype from source, read-only, as a detached
// mount (fsopen, fsmount: Linux 5.2) with the MOUNT_ATTR_* attrs, and returns a descriptor of
// its root. No mount namespace holds it: it lives as long as a descriptor on or below it.
func MountDetached(fstype, source string, attrs int) (*os.File, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("platform: fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "source", source); err != nil {
		return nil, fmt.Errorf("platform: mount %s: source %s: %w", fstype, source, err)
	}
	if attrs&unix.MOUNT_ATTR_RDONLY != 0 {
		if err := unix.FsconfigSetFlag(fs, "ro"); err != nil {
			return nil, fmt.Errorf("platform: mount %s read-only: %w", source, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, fmt.Errorf("platform: mount %s (type %s): %w", source, fstype, err)
	}
	mfd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return nil, fmt.Errorf("platform: fsmount %s: %w", source, err)
	}
	return os.NewFile(uintptr(mfd), source), nil
}

// MakePrivate makes every mount at and below target private (MS_PRIVATE|MS_REC), so that
// mounts made in this mount namespace never propagate to the host and vice versa.
func MakePrivate(target string) error {
	return Mount("", target, "", unix.MS_PRIVATE|unix.MS_REC, "")
}

// BindReadOnly bind-mounts source (recursively) on target and remounts the bind read-only,
// nosuid and nodev. A bind mount ignores MS_RDONLY on its first call, hence the remount.
func BindReadOnly(source, target string) error {
	if err := Mount(source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		// A mount that is locked (e.g. noexec on the source) may refuse dropping flags; keep
		// the source's flags it already has and add ours.
		var st unix.Statfs_t
		if serr := unix.Statfs(target, &st); serr == nil {
			flags |= uintptr(st.Flags) & (unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME)
			if err2 := unix.Mount("", target, "", flags, ""); err2 == nil {
				return nil
			}
		}
		return fmt.Errorf("platform: remount %s read-only: %w", target, err)
	}
	return nil
}

// Bind bind-mounts source on target with extra flags (applied by a remount), e.g.
// MS_NOSUID|MS_NODEV|MS_NOEXEC.
func Bind(source, target string, flags uintptr) error {
	if err := Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if flags == 0 {
		return nil
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		return fmt.Errorf("platform: remount bind %s: %w", target, err)
	}
	return nil
}

// PivotRoot makes newRoot (a mount point) the root of this mount namespace and detaches the
// old root, so that nothing of the old file system stays reachable.
func PivotRoot(newRoot string) error {
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("platform: chdir %s: %w", newRoot, err)
	}
	// pivot_root(".", ".") stacks the old root on top of the new one at "/", so no directory
	// for the old root is needed; unmounting "." then removes the old root.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("platform: pivot_root %s: %w", newRoot, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("platform: detach old root: %w", err)
	}
	return unix.Chdir("/")
}

// MountsUnder returns the mount points of this mount namespace at or below dir, deepest
// first (the order in which to unmount them).
func MountsUnder(dir string) ([]string, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	dir = strings.TrimSuffix(dir, "/")
	var out []string
	for _, m := range mounts {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// UnmountUnder lazily detaches every mount at or below dir in this mount namespace.
func UnmountUnder(dir string) error {
	points, err := MountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("platform: unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// MakeMountPoint creates an empty file or directory at p to mount something on, like the
// one at source (a directory or not).
func MakeMountPoint(p string, dir bool) error {
	if dir {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		return nil
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}
