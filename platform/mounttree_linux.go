//go:build linux

package platform

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// The functions here build mounts with the new mount API (Linux 5.2; overlay layers given as
// descriptors need 6.13, see [NewOverlay] for the older kernels): a mount is made detached, named by a descriptor, given its
// attributes, and then attached onto a target that is itself a descriptor. No path is
// resolved between choosing a target and mounting on it, so a link swapped in meanwhile
// cannot redirect the mount.

// NewMount makes a file system of type fstype as a detached mount with the MOUNT_ATTR_*
// attrs and returns a descriptor of its root. source may be "" (none); options is a
// comma-separated list as mount(8) takes it, each either a flag ("newinstance") or key=value
// ("mode=755").
func NewMount(fstype, source, options string, attrs int) (*os.File, error) {
	fsfd, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("platform: fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fsfd)
	if source != "" {
		if err := unix.FsconfigSetString(fsfd, "source", source); err != nil {
			return nil, fmt.Errorf("platform: mount %s: source %s: %w", fstype, source, err)
		}
	}
	if err := setOptions(fsfd, fstype, options); err != nil {
		return nil, err
	}
	return createMount(fsfd, fstype, attrs)
}

// OverlayLayers says how [NewOverlay] hands overlayfs its layers.
type OverlayLayers string

const (
	// OverlayLayersByFD gives each layer as a descriptor (fsconfig FSCONFIG_SET_FD with
	// "lowerdir+", "upperdir", "workdir"): Linux 6.13 and later.
	OverlayLayersByFD OverlayLayers = "descriptors"
	// OverlayLayersByPath names each layer by the path /proc/self/fd/<n> of a descriptor this
	// process holds ("lowerdir=/proc/self/fd/5:/proc/self/fd/6,upperdir=..."): every kernel
	// with overlayfs. See [NewOverlay] for why such a path is safe.
	OverlayLayersByPath OverlayLayers = "paths"
)

// NewOverlay makes an overlay as a detached mount with the MOUNT_ATTR_* attrs, its layers
// given as descriptors (lowers top first, upper and work may be nil for a read-only
// overlay), with further options as [NewMount] takes them, handed to overlayfs as how says.
//
// With [OverlayLayersByFD] the kernel takes the descriptors themselves. With
// [OverlayLayersByPath] (kernels before 6.13, which take no descriptor for a layer) each
// layer is named by /proc/self/fd/<n>, n a descriptor held here for the whole call. That path
// is safe whoever can write below the layers: /proc is the host's procfs, which no sandbox
// can change, and the kernel resolves /proc/self/fd/<n> as a magic link, straight to the
// very file the descriptor holds (its mount and dentry), never through the names of the
// directories above it, so a sandbox that renames or replaces a directory of a layer's path,
// or swaps in a link, steers nothing: the layer is what was opened, before the sandbox ran.
//
// The overlay's mount options name each layer by its path as this process sees it at the
// time: a layer opened on a detached mount (see [CloneMount]) shows as a path below "/" (or
// as /proc/self/fd/<n>), which reveals nothing of the host.
func NewOverlay(how OverlayLayers, lowers []*os.File, upper, work *os.File, options string, attrs int) (*os.File, error) {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("platform: fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", "overlay"); err != nil {
		return nil, fmt.Errorf("platform: mount overlay: source: %w", err)
	}
	switch how {
	case OverlayLayersByFD:
		err = setLayerFDs(fsfd, lowers, upper, work)
	case OverlayLayersByPath:
		err = setLayerPaths(fsfd, lowers, upper, work)
	default:
		err = fmt.Errorf("platform: mount overlay: no way %q to give its layers", how)
	}
	if err != nil {
		return nil, err
	}
	if err := setOptions(fsfd, "overlay", options); err != nil {
		return nil, err
	}
	return createMount(fsfd, "overlay", attrs)
}

func setLayerFDs(fsfd int, lowers []*os.File, upper, work *os.File) error {
	set := func(key string, f *os.File) error {
		err := control(f, func(fd int) error { return unix.FsconfigSetFd(fsfd, key, fd) })
		if err != nil {
			return fmt.Errorf("platform: mount overlay: %s %s: %w", key, f.Name(), err)
		}
		return nil
	}
	for _, l := range lowers {
		if err := set("lowerdir+", l); err != nil {
			return err
		}
	}
	if upper != nil {
		if err := set("upperdir", upper); err != nil {
			return err
		}
		return set("workdir", work)
	}
	return nil
}

// WithMountsAttached runs fn with the detached mounts attached, stacked on the directory
// target, in a mount namespace of its own: on a thread of its own that unshares its mount
// namespace (CLONE_NEWNS, every mount in it made private, so that nothing propagates to the
// host's) and ends with fn, taking that namespace, and the attachments in it, along.
//
// Before Linux 6.15 overlayfs takes no layer on a detached mount (clone_private_mount
// refuses a mount outside the caller's namespace: EINVAL): with [OverlayLayersByPath] the
// layers' mounts are attached this way while fn makes the overlay, which keeps clones of its
// own. target is only a place to stack them on, which nothing looks up below: the layers are
// still named by /proc/self/fd/<n>. fn runs with the thread locked (see [AsThreadUser]).
func WithMountsAttached(mounts []*os.File, target string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: Go ends the thread of a goroutine that exits locked, so no other
		// goroutine ever runs in this namespace.
		goruntime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("platform: a mount namespace for the layers: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("platform: make the layers' mount namespace private: %w", err)
			}
			for _, m := range mounts {
				// Private first: a clone of a shared mount (open_tree of a directory of a host
				// whose root is shared, as under systemd) is a peer of it, and a mount then
				// stacked on it would propagate to the host's namespace (found on Debian 12:
				// a sandbox's disk showed on the host base's directory).
				err := control(m, func(fd int) error {
					return unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Propagation: unix.MS_PRIVATE})
				})
				if err != nil {
					return fmt.Errorf("platform: make the layer's mount %s private: %w", m.Name(), err)
				}
				if err := AttachMountAt(m, target); err != nil {
					return err
				}
			}
			return fn()
		}()
	}()
	return <-errc
}

// setLayerPaths names the layers by /proc/self/fd/<n>. The descriptors must stay open until
// the overlay is created: before Linux 6.5 overlayfs (a "legacy" file system to fsconfig)
// resolves the paths only then, at FSCONFIG_CMD_CREATE, which the caller's files outlive.
func setLayerPaths(fsfd int, lowers []*os.File, upper, work *os.File) error {
	path := func(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }
	set := func(key, value string) error {
		if err := unix.FsconfigSetString(fsfd, key, value); err != nil {
			return fmt.Errorf("platform: mount overlay: %s %s: %w", key, value, err)
		}
		return nil
	}
	paths := make([]string, len(lowers))
	for i, l := range lowers {
		paths[i] = path(l)
	}
	if err := set("lowerdir", strings.Join(paths, ":")); err != nil {
		return err
	}
	if upper != nil {
		if err := set("upperdir", path(upper)); err != nil {
			return err
		}
		return set("workdir", path(work))
	}
	return nil
}

func setOptions(fsfd int, fstype, options string) error {
	if options == "" {
		return nil
	}
	for _, o := range strings.Split(options, ",") {
		var err error
		if k, v, ok := strings.Cut(o, "="); ok {
			err = unix.FsconfigSetString(fsfd, k, v)
		} else {
			err = unix.FsconfigSetFlag(fsfd, o)
		}
		if err != nil {
			return fmt.Errorf("platform: mount %s: option %q: %w", fstype, o, err)
		}
	}
	return nil
}

func createMount(fsfd int, fstype string, attrs int) (*os.File, error) {
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("platform: mount %s: %w", fstype, err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return nil, fmt.Errorf("platform: fsmount %s: %w", fstype, err)
	}
	return os.NewFile(uintptr(mfd), fstype), nil
}

// CloneMount clones the mount at p (relative to dir, or to the working directory if dir is
// nil) as a detached bind mount (open_tree with OPEN_TREE_CLONE), with the mounts below it if
// recursive, and returns a descriptor of its root. A final component that is a link is
// refused, not followed.
func CloneMount(dir *os.File, p string, recursive bool) (*os.File, error) {
	flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_SYMLINK_NOFOLLOW)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	name := p
	if p == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	clone := func(dirfd int) (int, error) {
		for {
			fd, err := unix.OpenTree(dirfd, p, flags)
			if err != unix.EINTR {
				return fd, err
			}
		}
	}
	var (
		fd  int
		err error
	)
	if dir == nil {
		fd, err = clone(unix.AT_FDCWD)
	} else {
		name = dir.Name() + "/" + p
		err = control(dir, func(dirfd int) error {
			var err error
			fd, err = clone(dirfd)
			return err
		})
	}
	if err != nil {
		return nil, &os.PathError{Op: "open_tree", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// SetMountAttrs sets the MOUNT_ATTR_* attrs on the mount m (and the mounts below it if
// recursive), leaving set any it already has (a bind of a noexec mount stays noexec).
func SetMountAttrs(m *os.File, attrs uint64, recursive bool) error {
	flags := uint(unix.AT_EMPTY_PATH)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	err := control(m, func(fd int) error {
		return unix.MountSetattr(fd, "", flags, &unix.MountAttr{Attr_set: attrs})
	})
	if err != nil {
		return fmt.Errorf("platform: set the attributes of mount %s: %w", m.Name(), err)
	}
	return nil
}

// AttachMount attaches the detached mount m onto target, a descriptor (O_PATH will do) of the
// directory or file to mount on (move_mount with both paths empty).
func AttachMount(m, target *os.File) error {
	err := control(m, func(mfd int) error {
		return control(target, func(tfd int) error {
			return unix.MoveMount(mfd, "", tfd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		})
	})
	if err != nil {
		return fmt.Errorf("platform: mount %s on %s: %w", m.Name(), target.Name(), err)
	}
	return nil
}

// AttachMountAt attaches the detached mount m at the path target, for a target that only
// trusted code can change.
func AttachMountAt(m *os.File, target string) error {
	err := control(m, func(mfd int) error {
		return unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH)
	})
	if err != nil {
		return fmt.Errorf("platform: mount %s on %s: %w", m.Name(), target, err)
	}
	return nil
}

// AttachMountOnCwd attaches the detached mount m onto the calling process's working
// directory, named by no path (AT_FDCWD with an empty path): this needs no permission to
// look anything up, not even ".", in a directory that the caller may not search.
func AttachMountOnCwd(m *os.File) error {
	err := control(m, func(mfd int) error {
		return unix.MoveMount(mfd, "", unix.AT_FDCWD, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
	})
	if err != nil {
		return fmt.Errorf("platform: mount %s on the working directory: %w", m.Name(), err)
	}
	return nil
}
