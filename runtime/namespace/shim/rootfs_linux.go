//go:build linux

package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
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

// setupRoot builds the sandbox's root file system on <dir>/rootfs (the init's working
// directory), inside the init's own mount namespace, from the mounts that the shim made
// (mounts, see [rootMounts]). Nothing here is visible to the host, and all of it goes when
// the namespace dies. It leaves the working directory at the new root, for pivot_root, and
// returns where the sandbox's own cgroup is mounted inside ("" if nowhere).
//
// Everything below the new root is the sandbox's to change, links included: every
// directory, file and link made there, and every mount target, is resolved through a handle
// of the root as if it were "/" ([platform.MkdirAllInRoot]), and every mount is made
// detached and attached onto a handle of its target ([platform.AttachMount]), so that no
// link the sandbox planted leads outside it. Only host paths (/dev/null) are named by path.
func setupRoot(cfg *initConfig, mounts []*os.File) (string, error) {
	root, err := setupRootMounts(cfg, mounts)
	if err != nil {
		return "", err
	}
	defer root.Close()
	cgroupDir, err := mountOwnCgroup(root, cfg.Spec.CgroupV2)
	if err != nil {
		return "", err
	}
	if err := unix.Fchdir(int(root.Fd())); err != nil {
		return "", fmt.Errorf("chdir to the new root: %w", err)
	}
	return cgroupDir, nil
}

// mountOwnCgroup mounts the sandbox's own cgroup read-only at /sys/fs/cgroup (v2) or
// /sys/fs/cgroup/memory (v1's memory hierarchy), for the agent's statistics. The init's
// cgroup namespace is rooted at the sandbox's cgroup ([settleCgroup] on v2), so nothing above
// it shows; on v2 with a pids limit, its children agent and workloads do.
func mountOwnCgroup(root *os.File, v2 bool) (string, error) {
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

// setupRootMounts attaches the overlay and the host binds that the shim made (see
// [rootMounts]) and mounts everything else but the cgroup. It returns a handle of the root.
//
// The overlay goes on the init's working directory, <dir>/rootfs, which it inherits from
// the shim: in a user namespace the init is root of that namespace alone and may not even
// look up the state directory (host root's, 0700), and it needs not.
func setupRootMounts(cfg *initConfig, mounts []*os.File) (*os.File, error) {
	// First of all: no mount made from here on may propagate back to the host.
	if err := platform.MakePrivate("/"); err != nil {
		return nil, err
	}
	if len(mounts) != 1+len(cfg.Binds) {
		return nil, fmt.Errorf("the shim handed %d mounts for an overlay and %d binds", len(mounts), len(cfg.Binds))
	}
	// The working directory is named by no path (AT_FDCWD, ""): the directory is host
	// root's, 0700, and in a user namespace the init may not even look "." up in it.
	var st unix.Stat_t
	if err := unix.Fstatat(unix.AT_FDCWD, "", &st, unix.AT_EMPTY_PATH); err != nil {
		return nil, fmt.Errorf("stat the working directory: %w", err)
	}
	if (platform.FileID{Dev: uint64(st.Dev), Ino: st.Ino}) != cfg.Rootfs {
		return nil, errors.New("the working directory is not the sandbox's rootfs")
	}
	root := mounts[0]
	if err := platform.AttachMountOnCwd(root); err != nil {
		return nil, err
	}
	if err := setupRootTree(cfg, root, mounts[1:]); err != nil {
		return nil, err
	}
	return root, nil
}

func setupRootTree(cfg *initConfig, root *os.File, binds []*os.File) error {
	for i, b := range binds {
		if err := attachDir(root, cfg.Binds[i], b); err != nil {
			return err
		}
	}
	if d, err := platform.MkdirAllInRoot(root, "tmp", 0o755); err != nil {
		return err
	} else {
		d.Close()
	}
	if err := setupProc(root, cfg.UserNamespace); err != nil {
		return err
	}
	if err := setupDev(root); err != nil {
		return err
	}
	// The control socket is not in the sandbox: the shim listens on the host, and the agent
	// accepts on the descriptor it inherits. /run/bothyd stays, an empty, small tmpfs of
	// root's alone, so that nothing written there reaches the host or lasts.
	return mountNew(root, "run/bothyd", "tmpfs", "mode=700,size=16k,nr_inodes=16",
		unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
}

// procMasked are /proc files that give the kernel's innards away or act on the whole host;
// they are hidden under /dev/null. procReadOnly are /proc directories made read-only, so that
// root in the sandbox cannot change host-wide kernel settings.
var (
	procMasked   = []string{"kcore", "keys", "sysrq-trigger", "timer_list", "latency_stats", "sched_debug", "kmsg"}
	procReadOnly = []string{"sys", "irq", "bus", "fs", "asound"}
)

// setupProc mounts the sandbox's /proc. In a user namespace (userns), it also sets the
// namespace's max_user_namespaces to 0: no process of the sandbox may make a user namespace
// of its own, the door to most of the kernel's code that unprivileged users reach (the
// seccomp filter refuses it too).
func setupProc(root *os.File, userns bool) error {
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
	if userns {
		if err := denyUserNamespaces(proc); err != nil {
			return err
		}
	}
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

// denyUserNamespaces writes 0 to max_user_namespaces of this user namespace, through the
// sandbox's fresh proc.
func denyUserNamespaces(proc *os.File) error {
	f, err := platform.OpenInRoot(proc, "sys/user/max_user_namespaces", unix.O_WRONLY|unix.O_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("max_user_namespaces: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString("0"); err != nil {
		return fmt.Errorf("max_user_namespaces: %w", err)
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
