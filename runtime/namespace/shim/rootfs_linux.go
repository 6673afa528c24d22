//go:build linux

package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
func setupRoot(spec *shimSpec) (string, error) {
	err := setupRootMounts(spec)
	if err != nil {
		return "", err
	}
	return mountOwnCgroup(rootfsPath(spec.Dir), spec.CgroupV2)
}

// mountOwnCgroup mounts the sandbox's own cgroup read-only at /sys/fs/cgroup (v2) or
// /sys/fs/cgroup/memory (v1's memory hierarchy), for the agent's statistics. The init's
// cgroup namespace is rooted at the sandbox's cgroup, so nothing above it shows.
func mountOwnCgroup(root string, v2 bool) (string, error) {
	if v2 {
		// The init was cloned into its cgroup without a cgroup namespace (see runShim); the
		// namespace made now is rooted at the sandbox's cgroup. This thread mounts, and
		// with cgo it is also the one that execs, so the whole sandbox gets it either way.
		if _, err := platform.UnshareCgroupNamespace(); err != nil {
			return "", err
		}
	}
	inside, fstype, data := "/sys/fs/cgroup", "cgroup2", ""
	if !v2 {
		inside, fstype, data = "/sys/fs/cgroup/memory", "cgroup", "memory"
	}
	target := filepath.Join(root, inside)
	if err := os.MkdirAll(target, 0o755); err != nil {
		return "", err
	}
	flags := uintptr(unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := platform.Mount(fstype, target, fstype, flags, data); err != nil {
		return "", err
	}
	return inside, nil
}

// mountDisk mounts the sandbox's own disk on <dir>/disk, in this mount namespace only, and
// returns the directory that holds the writable layer's upper and work directories. The loop
// device clears itself when the mount goes, which it does with the namespace: however the
// sandbox ends, nothing of its disk stays attached on the host.
func mountDisk(dir string) (string, error) {
	dev, err := platform.AttachLoop(filepath.Join(dir, EntryDiskImage))
	if err != nil {
		return "", err
	}
	defer dev.Close() // once mounted, the mount holds the device
	target := filepath.Join(dir, EntryDisk)
	if err := platform.Mount(dev.Name(), target, "ext4", unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return "", err
	}
	for _, e := range []struct {
		name string
		perm os.FileMode
	}{{EntryUpper, 0o755}, {EntryWork, 0o700}} {
		if err := platform.EnsureDir(target, e.name, e.perm); err != nil {
			return "", err
		}
	}
	return target, nil
}

func setupRootMounts(spec *shimSpec) error {
	// First of all: no mount made from here on may propagate back to the host.
	if err := platform.MakePrivate("/"); err != nil {
		return err
	}
	root := rootfsPath(spec.Dir)
	// The shim has made the host image's base layer (see runShim).
	lowers := append([]string{}, spec.Lowers...)
	if spec.ImageDir != "" {
		lowers = append(lowers, spec.ImageDir)
	} else {
		lowers = append(lowers, filepath.Join(spec.Dir, EntryHostFiles), spec.BaseDir)
	}
	layerDir := spec.Dir
	if spec.Disk {
		var err error
		if layerDir, err = mountDisk(spec.Dir); err != nil {
			return err
		}
	}
	// The upper layer must stand on its own once captured as a template generation: no
	// metadata-only copies that point into a lower (metacopy), no renamed directories that
	// refer to lower paths (redirect_dir), no inode index tied to these lowers (index).
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,redirect_dir=off,metacopy=off",
		strings.Join(lowers, ":"), filepath.Join(layerDir, EntryUpper), filepath.Join(layerDir, EntryWork))
	// nodev: no device node on the sandbox's own layers works, whoever made it.
	if err := platform.Mount("overlay", root, "overlay", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return err
	}
	if spec.ImageDir == "" {
		if err := platform.BindReadOnly("/usr", filepath.Join(root, "usr")); err != nil {
			return err
		}
		for _, name := range mergedUsrLinks {
			fi, err := os.Lstat("/" + name)
			if err != nil || fi.Mode()&os.ModeSymlink != 0 || !fi.IsDir() {
				continue // absent, or a link that the base layer reproduces
			}
			if err := platform.BindReadOnly("/"+name, filepath.Join(root, name)); err != nil {
				return err
			}
		}
		if fi, err := os.Lstat(filepath.Join(root, "etc/alternatives")); err == nil && fi.IsDir() {
			if err := platform.BindReadOnly("/etc/alternatives", filepath.Join(root, "etc/alternatives")); err != nil {
				return err
			}
		}
	}
	for _, d := range []string{"proc", "dev", "tmp", "run/sandboxd"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := setupProc(root); err != nil {
		return err
	}
	if err := setupDev(root); err != nil {
		return err
	}
	// The control directory is the only part of the state directory the sandbox sees; it is
	// root's (0700), so a workload running as user cannot reach the socket.
	ctl := filepath.Join(root, "run/sandboxd")
	if err := os.Chmod(ctl, 0o700); err != nil {
		return err
	}
	return platform.Bind(filepath.Join(spec.Dir, EntryControl), ctl, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
}

// procMasked are /proc files that give the kernel's innards away or act on the whole host;
// they are hidden under /dev/null. procReadOnly are /proc directories made read-only, so that
// root in the sandbox cannot change host-wide kernel settings.
var (
	procMasked   = []string{"kcore", "keys", "sysrq-trigger", "timer_list", "latency_stats", "sched_debug", "kmsg"}
	procReadOnly = []string{"sys", "irq", "bus", "fs", "asound"}
)

func setupProc(root string) error {
	p := filepath.Join(root, "proc")
	// A new proc, of the sandbox's own pid namespace: it lists only the sandbox's processes.
	if err := platform.Mount("proc", p, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	for _, name := range procReadOnly {
		t := filepath.Join(p, name)
		if _, err := os.Lstat(t); err != nil {
			continue
		}
		if err := platform.BindReadOnly(t, t); err != nil {
			return err
		}
	}
	for _, name := range procMasked {
		t := filepath.Join(p, name)
		if _, err := os.Lstat(t); err != nil {
			continue
		}
		if err := platform.Bind("/dev/null", t, 0); err != nil {
			return err
		}
	}
	return nil
}

func setupDev(root string) error {
	dev := filepath.Join(root, "dev")
	// nodev on the tmpfs itself: the nodes below are bind mounts that keep the host /dev's
	// flags, and no other node made here ever works.
	if err := platform.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=64k,nr_inodes=64"); err != nil {
		return err
	}
	for _, n := range devNodes {
		t := filepath.Join(dev, n)
		if err := platform.MakeMountPoint(t, false); err != nil {
			return err
		}
		if err := platform.Bind("/dev/"+n, t, 0); err != nil {
			return err
		}
	}
	pts := filepath.Join(dev, "pts")
	if err := os.Mkdir(pts, 0o755); err != nil {
		return err
	}
	if err := platform.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return err
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, os.ModeSticky|0o777); err != nil {
		return err
	}
	if err := platform.Mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=65536k"); err != nil {
		return err
	}
	links := [][2]string{
		{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
		{"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
	}
	for _, l := range links {
		if err := os.Symlink(l[0], filepath.Join(dev, l[1])); err != nil {
			return err
		}
	}
	return nil
}
