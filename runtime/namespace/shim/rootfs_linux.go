//go:build linux

package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/platform"
)

// The workload user of the host image.
const (
	userUID  = 1000
	userGID  = 1000
	userHome = "/home/user"
)

func rootfsPath(dir string) string { return filepath.Join(dir, EntryRootfs) }

// mergedUsrLinks are the top-level directories that a merged-usr host has as links into /usr.
var mergedUsrLinks = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// devNodes are the device nodes of the sandbox's /dev, bound from the host's.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// setupRoot builds the sandbox's root file system on <dir>/rootfs, inside the init's own mount
// namespace. Nothing here is visible to the host, and all of it goes when the namespace dies.
// It returns where the sandbox's own cgroup is mounted inside ("" if nowhere).
//
// The init is still host root here, and everything below the new root is the sandbox's to
// change, links included: every directory, file and link it makes there, and every mount
// target, is resolved through a handle of the root as if it were "/" ([platform.MkdirAllInRoot]),
// and every mount is made detached and attached onto a handle of its target
// ([platform.AttachMount]), so that no link the sandbox planted leads outside it. Only host
// paths (the layers, /usr, /dev/null) are named by path.
func setupRoot(spec *shimSpec) (string, error) {
	root, err := setupRootMounts(spec)
	if err != nil {
		return "", err
	}
	defer root.Close()
	return mountOwnCgroup(root, spec.CgroupV2)
}

// mountOwnCgroup mounts the sandbox's own cgroup read-only at /sys/fs/cgroup (v2) or
// /sys/fs/cgroup/memory (v1's memory hierarchy), for the agent's statistics. The init's
// cgroup namespace is rooted at the sandbox's cgroup, so nothing above it shows.
func mountOwnCgroup(root *os.File, v2 bool) (string, error) {
	if v2 {
		// The init was cloned into its cgroup without a cgroup namespace (see runShim); the
		// namespace made now is rooted at the sandbox's cgroup. This thread mounts, and
		// with cgo it is also the one that execs, so the whole sandbox gets it either way.
		if _, err := platform.UnshareCgroupNamespace(); err != nil {
			return "", err
		}
	}
	inside, fstype, opts := "/sys/fs/cgroup", "cgroup2", ""
	if !v2 {
		inside, fstype, opts = "/sys/fs/cgroup/memory", "cgroup", "memory"
	}
	attrs := unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC
	if err := mountNew(root, inside, fstype, opts, attrs); err != nil {
		return "", err
	}
	return inside, nil
}

// mountNew mounts a new file system of type fstype with options and the MOUNT_ATTR_* attrs
// on the directory p below root, made if missing.
func mountNew(root *os.File, p, fstype, options string, attrs int) error {
	m, err := platform.NewMount(fstype, fstype, options, attrs)
	if err != nil {
		return err
	}
	defer m.Close()
	return attachDir(root, p, m)
}

// attachDir attaches the detached mount m on the directory p below root, made if missing.
func attachDir(root *os.File, p string, m *os.File) error {
	target, err := platform.MkdirAllInRoot(root, p, 0o755)
	if err != nil {
		return err
	}
	defer target.Close()
	if err := refuseRoot(root, target, p); err != nil {
		return err
	}
	return platform.AttachMount(m, target)
}

// refuseRoot refuses a mount target that a link made the root itself: a mount there would
// hide the whole root file system under, say, the host's /usr.
func refuseRoot(root, target *os.File, p string) error {
	a, err := platform.IDOf(root)
	if err != nil {
		return err
	}
	b, err := platform.IDOf(target)
	if err != nil {
		return err
	}
	if a == b {
		return fmt.Errorf("%s resolves to the root file system itself", p)
	}
	return nil
}

// bindHost binds the host's src, read-only, nosuid and nodev, with the mounts below it, on
// the directory p below root.
func bindHost(root *os.File, src, p string) error {
	m, err := platform.CloneMount(nil, src, true)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := platform.SetMountAttrs(m, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV, true); err != nil {
		return err
	}
	return attachDir(root, p, m)
}

// openDiskLayer mounts the sandbox's own disk as a detached mount, which no path names and
// only the overlay built on it keeps, and returns a handle of its root, which holds the
// writable layer's upper and work directories. The loop device clears itself when the mount
// goes, which it does with the namespace: however the sandbox ends, nothing of its disk stays
// attached on the host.
func openDiskLayer(dir string) (*os.File, error) {
	dev, err := platform.AttachLoop(filepath.Join(dir, EntryDiskImage))
	if err != nil {
		return nil, err
	}
	defer dev.Close() // once mounted, the mount holds the device
	disk, err := platform.MountDetached("ext4", dev.Name(), unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return nil, err
	}
	for _, e := range []struct {
		name string
		perm os.FileMode
	}{{EntryUpper, 0o755}, {EntryWork, 0o700}} {
		if err := platform.MkdirAt(disk, e.name, e.perm); err != nil && !errors.Is(err, os.ErrExist) {
			disk.Close()
			return nil, err
		}
	}
	return disk, nil
}

// layers are the overlay's layers, each open on a detached clone of its mount: the overlay
// names a layer by its path as the init sees it when it mounts, and a layer on a detached
// mount is a path below "/", so the sandbox's mount table shows "lowerdir+=/",
// "upperdir=/upper" and "workdir=/work", not where the layers lie on the host.
type layers struct {
	lowers      []*os.File // top first, each the root of its clone
	upper, work *os.File
	// upperMount is the clone that holds upper and work (they must lie on one mount). A
	// clone lives as long as its own descriptor: closed before the overlay is made, it
	// would leave upper and work on a mount that is no longer mounted anywhere.
	upperMount *os.File
}

func (l *layers) Close() {
	for _, f := range append(l.lowers, l.upper, l.work, l.upperMount) {
		if f != nil {
			f.Close()
		}
	}
}

func openLayers(spec *shimSpec) (*layers, error) {
	paths := append([]string{}, spec.Lowers...)
	if spec.ImageDir != "" {
		paths = append(paths, spec.ImageDir)
	} else {
		// The shim has made the host image's base layer (see runShim).
		paths = append(paths, filepath.Join(spec.Dir, EntryHostFiles), spec.BaseDir)
	}
	l := &layers{}
	for _, p := range paths {
		f, err := platform.CloneMount(nil, p, false)
		if err != nil {
			l.Close()
			return nil, err
		}
		l.lowers = append(l.lowers, f)
	}
	var err error
	if spec.Disk {
		l.upperMount, err = openDiskLayer(spec.Dir)
	} else {
		l.upperMount, err = platform.CloneMount(nil, spec.Dir, false)
	}
	if err == nil {
		if l.upper, err = platform.OpenDirAt(l.upperMount, EntryUpper); err == nil {
			l.work, err = platform.OpenDirAt(l.upperMount, EntryWork)
		}
	}
	if err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// mountOverlay mounts the sandbox's overlay on <dir>/rootfs and returns a handle of its root.
func mountOverlay(spec *shimSpec) (*os.File, error) {
	l, err := openLayers(spec)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	// The upper layer must stand on its own once captured as a template generation: no
	// metadata-only copies that point into a lower (metacopy), no renamed directories that
	// refer to lower paths (redirect_dir), no inode index tied to these lowers (index).
	// nodev: no device node on the sandbox's own layers works, whoever made it.
	m, err := platform.NewOverlay(l.lowers, l.upper, l.work, "index=off,redirect_dir=off,metacopy=off",
		unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return nil, err
	}
	// <dir>/rootfs is the host's, not the sandbox's: a path will do.
	if err := platform.AttachMountAt(m, rootfsPath(spec.Dir)); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// setupRootMounts mounts the overlay and everything on it but the cgroup, and returns a
// handle of the root.
func setupRootMounts(spec *shimSpec) (*os.File, error) {
	// First of all: no mount made from here on may propagate back to the host.
	if err := platform.MakePrivate("/"); err != nil {
		return nil, err
	}
	root, err := mountOverlay(spec)
	if err != nil {
		return nil, err
	}
	if err := setupRootTree(spec, root); err != nil {
		root.Close()
		return nil, err
	}
	return root, nil
}

func setupRootTree(spec *shimSpec, root *os.File) error {
	if spec.ImageDir == "" {
		if err := bindHost(root, "/usr", "usr"); err != nil {
			return err
		}
		for _, name := range mergedUsrLinks {
			fi, err := os.Lstat("/" + name)
			if err != nil || fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
				continue // absent, or a link that the base layer reproduces
			}
			if err := bindHost(root, "/"+name, name); err != nil {
				return err
			}
		}
		if d, err := platform.OpenInRoot(root, "etc/alternatives", unix.O_PATH|unix.O_DIRECTORY); err == nil {
			d.Close()
			if err := bindHost(root, "/etc/alternatives", "etc/alternatives"); err != nil {
				return err
			}
		}
	}
	if d, err := platform.MkdirAllInRoot(root, "tmp", 0o755); err != nil {
		return err
	} else {
		d.Close()
	}
	if err := setupProc(root); err != nil {
		return err
	}
	if err := setupDev(root); err != nil {
		return err
	}
	// The control socket is not in the sandbox: the shim listens on the host, and the agent
	// accepts on the descriptor it inherits. /run/sandboxd stays, an empty, small tmpfs of
	// root's alone, so that nothing written there reaches the host or lasts.
	return mountNew(root, "run/sandboxd", "tmpfs", "mode=700,size=16k,nr_inodes=16",
		unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
}

// procMasked are /proc files that give the kernel's innards away or act on the whole host;
// they are hidden under /dev/null. procReadOnly are /proc directories made read-only, so that
// root in the sandbox cannot change host-wide kernel settings.
var (
	procMasked   = []string{"kcore", "keys", "sysrq-trigger", "timer_list", "latency_stats", "sched_debug", "kmsg"}
	procReadOnly = []string{"sys", "irq", "bus", "fs", "asound"}
)

func setupProc(root *os.File) error {
	// A new proc, of the sandbox's own pid namespace: it lists only the sandbox's processes.
	proc, err := platform.NewMount("proc", "proc", "", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	defer proc.Close()
	if err := attachDir(root, "proc", proc); err != nil {
		return err
	}
	// Below the fresh proc, nothing is the sandbox's: its entries are resolved beneath it.
	for _, name := range procReadOnly {
		target, err := platform.OpenInRoot(proc, name, unix.O_PATH|unix.O_NOFOLLOW)
		if err != nil {
			continue
		}
		err = func() error {
			defer target.Close()
			m, err := platform.CloneMount(proc, name, true)
			if err != nil {
				return err
			}
			defer m.Close()
			if err := platform.SetMountAttrs(m, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV, true); err != nil {
				return err
			}
			return platform.AttachMount(m, target)
		}()
		if err != nil {
			return err
		}
	}
	for _, name := range procMasked {
		target, err := platform.OpenInRoot(proc, name, unix.O_PATH|unix.O_NOFOLLOW)
		if err != nil {
			continue
		}
		err = bindDevNode(target, "null")
		target.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// bindDevNode binds the host's /dev/<name> on target.
func bindDevNode(target *os.File, name string) error {
	m, err := platform.CloneMount(nil, "/dev/"+name, false)
	if err != nil {
		return err
	}
	defer m.Close()
	return platform.AttachMount(m, target)
}

func setupDev(root *os.File) error {
	// nodev on the tmpfs itself: the nodes below are bind mounts that keep the host /dev's
	// flags, and no other node made here ever works.
	dev, err := platform.NewMount("tmpfs", "tmpfs", "mode=755,size=64k,nr_inodes=64",
		unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	defer dev.Close()
	if err := attachDir(root, "dev", dev); err != nil {
		return err
	}
	// The tmpfs is fresh: everything below is made through its handle.
	for _, n := range devNodes {
		t, err := platform.MakeFileInRoot(dev, n, 0o644)
		if err != nil {
			return err
		}
		err = bindDevNode(t, n)
		t.Close()
		if err != nil {
			return err
		}
	}
	if err := mountNew(dev, "pts", "devpts", "newinstance,ptmxmode=0666,mode=0620,gid=5",
		unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC); err != nil {
		return err
	}
	if err := mountNew(dev, "shm", "tmpfs", "mode=1777,size=65536k",
		unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC); err != nil {
		return err
	}
	links := [][2]string{
		{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
		{"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
	}
	for _, l := range links {
		if err := platform.SymlinkInRoot(dev, l[1], l[0]); err != nil {
			return err
		}
	}
	return nil
}
