//go:build linux

package namespace

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

func rootfsPath(dir string) string { return filepath.Join(dir, entryRootfs) }

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
	dev, err := platform.AttachLoop(filepath.Join(dir, entryDiskImage))
	if err != nil {
		return "", err
	}
	defer dev.Close() // once mounted, the mount holds the device
	target := filepath.Join(dir, entryDisk)
	if err := platform.Mount(dev.Name(), target, "ext4", unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return "", err
	}
	for _, e := range []struct {
		name string
		perm os.FileMode
	}{{entryUpper, 0o755}, {entryWork, 0o700}} {
		if err := ensureDir(target, e.name, e.perm); err != nil {
			return "", err
		}
	}
	return target, nil
}

// openDiskLayer opens the writable layer on a stopped sandbox's own disk, for a capture. The
// disk is mounted read-only as a detached mount (fsopen, fsmount), which no mount namespace
// holds: the returned descriptor alone keeps it (and so the loop device) alive, and once the
// last descriptor below it is closed, both go. Nothing is mounted anywhere.
//
// (A mount in a mount namespace of a thread's own would need the thread to die with its
// namespace; Go never ends the main thread, which a locked goroutine may run on, so the mount
// could outlive the capture.)
func openDiskLayer(dir string) (*os.File, error) {
	img := filepath.Join(dir, entryDiskImage)
	if _, err := os.Lstat(img); err != nil {
		return nil, err // never started: no disk yet
	}
	dev, err := platform.AttachLoop(img)
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	mnt, err := platform.MountDetached("ext4", dev.Name(), unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, err
	}
	defer mnt.Close()
	return platform.OpenDirAt(mnt, entryUpper)
}

func setupRootMounts(spec *shimSpec) error {
	// First of all: no mount made from here on may propagate back to the host.
	if err := platform.MakePrivate("/"); err != nil {
		return err
	}
	root := rootfsPath(spec.Dir)
	// The shim has built the host image's base layer (see runShim).
	lowest := spec.ImageDir
	if lowest == "" {
		lowest = filepath.Join(spec.Dir, entryBase)
	}
	lowers := append(append([]string{}, spec.Lowers...), lowest)
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
		strings.Join(lowers, ":"), filepath.Join(layerDir, entryUpper), filepath.Join(layerDir, entryWork))
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
	return platform.Bind(filepath.Join(spec.Dir, entryControl), ctl, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
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

// baseStampName marks a complete host base layer; its content says for what it was built.
const baseStampName = ".sandboxd-base"

// hostBaseStamp identifies what buildHostBase writes: a change of layout (baseFormat) or of
// host name rebuilds the layer. Host files copied into it are refreshed on such a rebuild
// only; they are public and change rarely (os-release, ld.so.cache).
func hostBaseStamp(hostname string) string {
	return fmt.Sprintf("format 2\nhostname %s\n", hostname)
}

// buildHostBase writes the lowest layer of the host image into base: the directory skeleton,
// the merged-usr links, and a generated /etc. It is rebuilt at every start (the host may have
// changed), and holds nothing secret.
func buildHostBase(base, hostname string) error {
	stamp := hostBaseStamp(hostname)
	if b, err := os.ReadFile(filepath.Join(base, baseStampName)); err == nil && string(b) == stamp {
		return nil // built by an earlier start of this sandbox, for the same host name
	}
	if err := os.RemoveAll(base); err != nil {
		return err
	}
	if err := os.Mkdir(base, 0o755); err != nil {
		return err
	}
	dirs := []struct {
		name string
		perm os.FileMode
	}{
		{"usr", 0o755}, {"proc", 0o555}, {"dev", 0o755}, {"etc", 0o755}, {"run", 0o755},
		{"run/sandboxd", 0o700}, {"tmp", os.ModeSticky | 0o777}, {"var", 0o755}, {"var/tmp", os.ModeSticky | 0o777},
		{"home", 0o755}, {"home/user", 0o755}, {"root", 0o700}, {"opt", 0o755}, {"mnt", 0o755},
		{"srv", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(base, d.name)
		// The shim runs with umask 0, so the mode is exact without a chmod.
		if err := os.Mkdir(p, d.perm); err != nil {
			return err
		}
	}
	if err := os.Chown(filepath.Join(base, "home/user"), userUID, userGID); err != nil {
		return err
	}
	for _, name := range mergedUsrLinks {
		fi, err := os.Lstat("/" + name)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink("/" + name)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(base, name)); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(filepath.Join(base, name), 0o755); err != nil {
				return err
			}
		}
	}
	shell := "/bin/sh"
	if _, err := os.Stat("/usr/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	etc := filepath.Join(base, "etc")
	files := map[string]string{
		"passwd": "root:x:0:0:root:/root:" + shell + "\n" +
			fmt.Sprintf("user:x:%d:%d:user:%s:%s\n", userUID, userGID, userHome, shell) +
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group": "root:x:0:\ntty:x:5:\nusers:x:100:\n" +
			fmt.Sprintf("user:x:%d:\n", userGID) + "nogroup:x:65534:\n",
		"hosts":         "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + hostname + "\n",
		"hostname":      hostname + "\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
		// The sandbox has no network but loopback; a resolver that points nowhere fails fast.
		"resolv.conf": "nameserver 127.0.0.1\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	// Public host files that programs expect, copied by content.
	for _, name := range []string{"os-release", "ld.so.cache", "ld.so.conf", "protocols", "services", "issue"} {
		b, err := os.ReadFile(filepath.Join("/etc", name))
		if err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(etc, name), b, 0o644); err != nil {
			return err
		}
	}
	if target, err := os.Readlink("/etc/localtime"); err == nil && strings.HasPrefix(target, "/usr/") {
		_ = os.Symlink(target, filepath.Join(etc, "localtime"))
	}
	// Debian's alternatives (awk, editor, ...) are links through /etc/alternatives into /usr;
	// the host's directory of links is bound read-only over this mount point.
	if fi, err := os.Lstat("/etc/alternatives"); err == nil && fi.IsDir() {
		if err := os.Mkdir(filepath.Join(etc, "alternatives"), 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(base, baseStampName), []byte(stamp), 0o644)
}
