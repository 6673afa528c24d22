//go:build linux

package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// rootMounts are the mounts of the sandbox's root that the shim makes, on the host and as host
// root, for the init to attach: its overlay and the host's read-only directories. The kernel
// lets only host root idmap a mount (its file system belongs to the host's user namespace)
// and lets only host root's overlay keep its opaque directories in trusted.* extended
// attributes, the format of every writable layer and template generation; the init is root
// of its user namespace alone. Each is a detached mount, which the init attaches in its own
// mount namespace.
type rootMounts struct {
	overlay *os.File
	// diskLock is the lock of the sandbox's disk (LockDisk), nil without one: it is the
	// launch's until the release (release_linux.go).
	diskLock *os.File
	// binds are the host's directories, each to be attached at bindPaths[i] below the root.
	binds     []*os.File
	bindPaths []string
}

// files lists the descriptors in the order the init receives them: the overlay, then the binds.
func (m *rootMounts) files() []*os.File { return append([]*os.File{m.overlay}, m.binds...) }

func (m *rootMounts) Close() {
	if m == nil {
		return
	}
	for _, f := range append(m.files(), m.diskLock) {
		if f != nil {
			f.Close()
		}
	}
}

// keep takes the overlay and the disk's lock out of m, for the launch to hold until its
// release; m.Close then leaves them open.
func (m *rootMounts) keep() held {
	h := held{root: m.overlay, diskLock: m.diskLock}
	m.overlay, m.diskLock = nil, nil
	return h
}

// makeRootMounts makes the sandbox's overlay and the host binds of spec. With a user
// namespace (userns and ids not nil) every layer and bind is idmapped by userns's mapping: the
// ids on disk are the sandbox's own (1000 on disk is 1000 inside, 0 is its root), so that the
// layers, template generations and disk images need no change of ownership, whichever host
// ids the sandbox runs as this time.
func makeRootMounts(spec *shimSpec, userns *os.File, ids *idRange) (*rootMounts, error) {
	l, err := openLayers(spec, userns, ids)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	m := &rootMounts{diskLock: l.diskLock}
	l.diskLock = nil
	// The overlay writes its own files (whiteouts, its work directory) with the credentials of
	// its maker: made as the sandbox's root (host root's capabilities, the range's first id),
	// they are written through the idmapped upper as the sandbox's root, id 0 on disk, as
	// without a user namespace. Made as host root, whose id the mapping lacks, they could not
	// be written at all.
	mk := func() error {
		var err error
		m.overlay, err = newOverlay(l, spec.Mounts.overlayLayers())
		return err
	}
	run := mk
	if ids != nil {
		run = func() error { return platform.AsThreadUser(int(ids.base), int(ids.base), mk) }
	}
	if how := spec.Mounts.overlayLayers(); how == platform.OverlayLayersByPath {
		// Before Linux 6.15 overlayfs takes no layer on a detached mount: the layers' mounts
		// are attached, in a mount namespace of the overlay's maker alone, on the state
		// directory's rootfs (a directory of the host's, which only this thread's namespace
		// sees them on), and the overlay names them by /proc/self/fd path all the same.
		err = platform.WithMountsAttached(l.holders(), rootfsPath(spec.Dir), run)
	} else {
		err = run()
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	if spec.ImageDir == "" {
		if err := m.addHostBinds(userns); err != nil {
			m.Close()
			return nil, err
		}
	}
	if err := m.addVolumes(spec.Volumes, userns); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// addVolumes clones each volume's host mount (package volume: an ext4 file system, one
// superblock that every sandbox mounting the volume shares, so that each sees the others'
// writes), nosuid and nodev, read-only if asked, idmapped by userns: the ids on the volume
// are the sandbox's own (1000 on disk is the workload user in every sandbox, whichever host
// ids its slot gives it), as on its layers. A volume that cannot be idmapped fails the start:
// bound as it is, its files would show as nobody's and the sandbox's writes as ids of the
// host's. They are attached after the host binds, at their paths below the root.
func (m *rootMounts) addVolumes(vols []runtime.VolumeMount, userns *os.File) error {
	for _, v := range vols {
		c, err := platform.CloneMount(nil, v.Source, false)
		if err != nil {
			return fmt.Errorf("volume at %s: %w", v.Target, err)
		}
		attrs := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if v.ReadOnly {
			attrs |= unix.MOUNT_ATTR_RDONLY
		}
		if err := platform.SetMountAttrs(c, attrs, false); err != nil {
			c.Close()
			return fmt.Errorf("volume at %s: %w", v.Target, err)
		}
		if userns != nil {
			if err := platform.SetMountIDMap(c, userns, false); err != nil {
				c.Close()
				return fmt.Errorf("volume at %s: %w", v.Target, err)
			}
		}
		m.binds = append(m.binds, c)
		m.bindPaths = append(m.bindPaths, strings.TrimPrefix(v.Target, "/"))
	}
	return nil
}

// addHostBinds binds the host's /usr, the top-level directories of a host without merged usr
// (/bin, /lib...), and /etc/alternatives if the base layer has it.
func (m *rootMounts) addHostBinds(userns *os.File) error {
	srcs := []string{"/usr"}
	for _, name := range mergedUsrLinks {
		fi, err := os.Lstat("/" + name)
		if err != nil || fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
			continue // absent, or a link that the base layer reproduces
		}
		srcs = append(srcs, "/"+name)
	}
	if d, err := platform.OpenInRoot(m.overlay, "etc/alternatives", unix.O_PATH|unix.O_DIRECTORY); err == nil {
		d.Close()
		srcs = append(srcs, "/etc/alternatives")
	}
	for _, src := range srcs {
		b, err := cloneHost(src, userns)
		if err != nil {
			return err
		}
		m.binds = append(m.binds, b)
		m.bindPaths = append(m.bindPaths, src[1:])
	}
	return nil
}

// cloneHost clones the host's src, with the mounts below it, read-only, nosuid and nodev,
// idmapped by userns if not nil. A host file system that cannot be idmapped is bound as it
// is: its files then show as owned by nobody inside, and stay readable and executable as
// their modes say.
func cloneHost(src string, userns *os.File) (*os.File, error) {
	m, err := platform.CloneMount(nil, src, true)
	if err != nil {
		return nil, err
	}
	if err := platform.SetMountAttrs(m, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV, true); err != nil {
		m.Close()
		return nil, err
	}
	if userns != nil {
		if err := platform.SetMountIDMap(m, userns, true); errors.Is(err, platform.ErrIDMapUnsupported) {
			logf("%s is bound without an id mapping: %v", src, err)
		} else if err != nil {
			m.Close()
			return nil, err
		}
	}
	return m, nil
}

// openDiskLayer mounts the sandbox's own disk as a detached mount, which no path names and
// only the overlay built on it keeps, and returns a handle of its root, which holds the
// writable layer's upper and work directories, and the disk's lock, taken first. The loop
// device clears itself when the mount goes, which it does with the overlay, once the
// sandbox's mount namespace and the launch's own handle of the overlay are gone (see
// release_linux.go): however the sandbox ends, nothing of its disk stays attached on the
// host.
func openDiskLayer(dir string, userns *os.File) (disk, lock *os.File, err error) {
	img := filepath.Join(dir, EntryDiskImage)
	lock, err = LockDisk(img, true, func() { logf("waiting for the release of the disk by an earlier launch") })
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	dev, err := platform.AttachLoop(img)
	if err != nil {
		return nil, nil, err
	}
	defer dev.Close() // once mounted, the mount holds the device
	disk, err = platform.MountDetached("ext4", dev.Name(), unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range []struct {
		name string
		perm os.FileMode
	}{{EntryUpper, 0o755}, {EntryWork, 0o700}} {
		if err := platform.MkdirAt(disk, e.name, e.perm); err != nil && !errors.Is(err, os.ErrExist) {
			disk.Close()
			return nil, nil, err
		}
	}
	if err := idmap(disk, userns); err != nil {
		disk.Close()
		return nil, nil, err
	}
	return disk, lock, nil
}

// idmap idmaps the detached mount m by userns, unless userns is nil. Every layer of the
// overlay must be idmapped: an unmapped one would show host root's files as nobody's.
func idmap(m, userns *os.File) error {
	if userns == nil {
		return nil
	}
	err := platform.SetMountIDMap(m, userns, false)
	if errors.Is(err, platform.ErrIDMapUnsupported) {
		// The message names bothyd's flag for Config.IDs.Off: it reaches the API's caller
		// and the operator through the start's error, who run bothyd, not this package.
		return fmt.Errorf("%w: a sandbox's user namespace needs its state directory and layers on a file system that can be idmapped (ext4, xfs, btrfs, tmpfs); move the state root to one, or run bothyd with --user-namespaces=false (sandboxes then run with the host's ids)", err)
	}
	return err
}

// layers are the overlay's layers, each open on a detached clone of its mount: the overlay
// names a layer by its path as the shim sees it when it makes the overlay, and a layer on a
// detached mount is a path below "/", so the sandbox's mount table shows "lowerdir+=/",
// "upperdir=/upper" and "workdir=/work", not where the layers lie on the host.
type layers struct {
	lowers      []*os.File // top first, each the root of its clone
	upper, work *os.File
	// upperMount is the clone that holds upper and work (they must lie on one mount). A
	// clone lives as long as its own descriptor: closed before the overlay is made, it
	// would leave upper and work on a mount that is no longer mounted anywhere.
	upperMount *os.File
	// diskLock is the disk's lock when upperMount is the sandbox's own disk.
	diskLock *os.File
}

// holders are the mounts that hold the layers: each lower's, and the upper and work's.
func (l *layers) holders() []*os.File { return append(slices.Clone(l.lowers), l.upperMount) }

func (l *layers) Close() {
	for _, f := range append(l.lowers, l.upper, l.work, l.upperMount, l.diskLock) {
		if f != nil {
			f.Close()
		}
	}
}

func openLayers(spec *shimSpec, userns *os.File, ids *idRange) (*layers, error) {
	l := &layers{}
	if err := l.open(spec, userns, ids); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// open opens the lowers, top first, then the upper and work directories; on an error, what
// it opened is in l for the caller to close.
func (l *layers) open(spec *shimSpec, userns *os.File, ids *idRange) error {
	lower := func(f *os.File, err error) error {
		if err != nil {
			return err
		}
		l.lowers = append(l.lowers, f)
		return idmap(f, userns)
	}
	for _, p := range spec.Lowers {
		if err := lower(platform.CloneMount(nil, p, false)); err != nil {
			return err
		}
	}
	var err error
	if spec.ImageDir != "" {
		err = lower(platform.CloneMount(nil, spec.ImageDir, false))
	} else if err = l.hostFiles(spec, userns, ids); err == nil {
		// The shim has made the host image's base layer (see runShim).
		err = lower(platform.CloneMount(nil, spec.BaseDir, false))
	}
	if err != nil {
		return err
	}
	if spec.Disk {
		l.upperMount, l.diskLock, err = openDiskLayer(spec.Dir, userns)
	} else if l.upperMount, err = platform.CloneMount(nil, spec.Dir, false); err == nil {
		err = idmap(l.upperMount, userns)
	}
	if err != nil {
		return err
	}
	if l.upper, err = platform.OpenDirAt(l.upperMount, EntryUpper); err != nil {
		return err
	}
	l.work, err = platform.OpenDirAt(l.upperMount, EntryWork)
	return err
}

// hostFiles adds the host files' layer, a tmpfs, to the lowers: idmapped like the others
// where the kernel idmaps a tmpfs (Linux 6.3), else made owned by the host id of the
// sandbox's root, which shows inside as root's (see Mounts.TmpfsIDMap).
func (l *layers) hostFiles(spec *shimSpec, userns *os.File, ids *idRange) error {
	owner := -1
	if userns != nil && !spec.Mounts.TmpfsIDMap {
		owner = int(ids.base)
	}
	m, err := hostFilesLayer(spec.Hostname, owner)
	if err != nil {
		return err
	}
	l.lowers = append(l.lowers, m)
	if owner >= 0 {
		return nil
	}
	return idmap(m, userns)
}

// newOverlay makes the sandbox's overlay, detached, on the layers l, handed to overlayfs as
// how says.
func newOverlay(l *layers, how platform.OverlayLayers) (*os.File, error) {
	// The upper layer must stand on its own once captured as a template generation: no
	// metadata-only copies that point into a lower (metacopy), no renamed directories that
	// refer to lower paths (redirect_dir), no inode index tied to these lowers (index).
	// nodev: no device node on the sandbox's own layers works, whoever made it.
	m, err := platform.NewOverlay(how, l.lowers, l.upper, l.work, "index=off,redirect_dir=off,metacopy=off",
		unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return nil, fmt.Errorf("the sandbox's overlay: %w", err)
	}
	return m, nil
}
