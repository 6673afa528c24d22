//go:build linux

package namespace

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// The kernels users run differ in how they build a sandbox's root (docs/install.md lists
// the minimum of each feature):
//
//   - overlayfs takes its layers as descriptors from Linux 6.13 on; before, it is given the
//     paths /proc/self/fd/<n> of descriptors the shim holds (platform.NewOverlay says why
//     that is as safe);
//   - tmpfs takes idmapped mounts from 6.3 on; before, the host files' layer, the one tmpfs
//     layer, is owned by the host id of the sandbox's root instead;
//   - overlayfs takes idmapped layers from 5.19 on, and the state root's file system must
//     take idmapped mounts (ext4, xfs, btrfs from 5.12 to 5.15): without either, sandboxes
//     cannot have user namespaces, and the runtime refuses to start any, saying so, until
//     bothyd runs with --user-namespaces=false.
//
// probeMounts chooses once, at start-up, by trying each mechanism on scratch mounts (detached
// tmpfs mounts that no path names and a detached clone of the state root, all gone when
// their descriptors close): a kernel's version says little, since distributions backport.

// mountProbe is what probeMounts found.
type mountProbe struct {
	mounts  shim.Mounts
	report  runtime.Mechanisms
	refusal error
	// root is the state root probed.
	root string
	// notes are what the probes found that the choice does not show (errors of the
	// mechanisms not taken), for the log.
	notes []string
}

// probeMounts probes the kernel's mount mechanisms for sandboxes with user namespaces unless
// cfg.IDs.Off, with the state root cfg.StateRoot ("" skips its probe). cfg.ForceFallbacks
// takes the fallbacks wherever they work.
func probeMounts(cfg Config) mountProbe {
	p := mountProbe{root: cfg.StateRoot, report: runtime.Mechanisms{Kernel: kernelRelease(), UserNamespaces: !cfg.IDs.Off, Forced: cfg.ForceFallbacks}}
	refuse := func(feature, minimum, todo string, err error) {
		p.refusal = errcode.New(errcode.Unavailable,
			"This host's kernel (Linux %s) cannot give the namespace runtime %s, which needs Linux %s or later (%v); %s. docs/install.md lists the kernel each feature needs.",
			p.report.Kernel, feature, minimum, err, todo)
	}
	scratch, err := newScratch()
	if err != nil {
		refuse("the new mount API (fsopen, fsmount)", "5.12", "upgrade the kernel", err)
		return p
	}
	scratch.Close()

	how, err := p.probeOverlay(nil, cfg.ForceFallbacks)
	if err != nil {
		refuse("overlayfs", "5.12", "load the overlay module (modprobe overlay) or upgrade the kernel", err)
		return p
	}
	p.mounts.OverlayLayers = how
	p.report.OverlayLayers = string(how)
	if cfg.IDs.Off {
		return p
	}

	userns, stop, err := holdUserNamespace(cfg.Executable)
	if err != nil {
		refuse("user namespaces", "5.12", "allow user namespaces (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone), or run bothyd with --user-namespaces=false", err)
		return p
	}
	defer stop()
	if err := probeIDMap(userns, ""); err != nil || cfg.ForceFallbacks {
		if err != nil {
			p.notes = append(p.notes, fmt.Sprintf("tmpfs: %v", err))
		}
		p.report.TmpfsOwnership = "chowned"
	} else {
		p.mounts.TmpfsIDMap = true
		p.report.TmpfsOwnership = "idmapped"
	}
	if cfg.StateRoot == "" {
		return p
	}
	if err := probeIDMap(userns, cfg.StateRoot); err != nil {
		// The file system more than the kernel: overlayfs and NFS take no id mapping on any.
		p.refusal = errcode.New(errcode.Unavailable,
			"The state root %s is on a file system that this host's kernel (Linux %s) cannot idmap (%v), and sandboxes in user namespaces need idmapped layers (ext4, xfs and btrfs from Linux 5.12, tmpfs from 6.3; never overlayfs or NFS); put the state root on ext4, xfs or btrfs, or run bothyd with --user-namespaces=false (sandboxes then run with the host's ids). docs/install.md lists the kernel each feature needs.",
			cfg.StateRoot, p.report.Kernel, err)
		return p
	}
	if _, err := p.probeOverlay(userns, false); err != nil {
		// The overlay of the mechanism chosen above worked without an idmapped layer: the
		// idmapped layer is what this kernel refuses.
		refuse("overlays of idmapped layers (user namespaces)", "5.19",
			"upgrade the kernel, or run bothyd with --user-namespaces=false (sandboxes then run with the host's ids)", err)
		return p
	}
	return p
}

// scratch is a detached tmpfs with the directories an overlay needs.
type scratch struct {
	root                        *os.File
	lower1, lower2, upper, work *os.File
}

func newScratch() (*scratch, error) {
	m, err := platform.NewMount("tmpfs", "bothyd-probe", "size=64k,nr_inodes=16,mode=0700",
		unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, err
	}
	s := &scratch{root: m}
	for _, d := range []struct {
		name string
		f    **os.File
	}{{"l1", &s.lower1}, {"l2", &s.lower2}, {"u", &s.upper}, {"w", &s.work}} {
		if err := platform.MkdirAt(m, d.name, 0o700); err != nil {
			s.Close()
			return nil, err
		}
		if *d.f, err = platform.OpenDirAt(m, d.name); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *scratch) Close() {
	for _, f := range []*os.File{s.lower1, s.lower2, s.upper, s.work, s.root} {
		if f != nil {
			f.Close()
		}
	}
}

// probeOverlay makes a writable overlay of fresh scratch directories, or, if userns is not
// nil, a read-only one with an idmapped clone of the state root as a layer, its layers given
// as descriptors unless fallback, else (or where descriptors are refused) by path. With
// userns it tries the way chosen already. It returns the way that worked.
func (p *mountProbe) probeOverlay(userns *os.File, fallback bool) (platform.OverlayLayers, error) {
	if userns != nil {
		// A read-only overlay of an idmapped clone of the state root (the layers of
		// sandboxes are idmapped clones of its directories) above a tmpfs (as the host files'
		// layer is, not idmapped where the kernel cannot) tries what sandboxes need of it.
		clone, err := idmappedClone(userns, p.root)
		if err != nil {
			return "", err
		}
		defer clone.Close()
		return p.mounts.OverlayLayers, tryOverlay(p.mounts.OverlayLayers, clone)
	}
	var fdErr error
	if !fallback {
		if fdErr = tryOverlay(platform.OverlayLayersByFD, nil); fdErr == nil {
			return platform.OverlayLayersByFD, nil
		}
		p.notes = append(p.notes, fmt.Sprintf("overlay layers as descriptors: %v", fdErr))
	}
	if err := tryOverlay(platform.OverlayLayersByPath, nil); err != nil {
		return "", errors.Join(fdErr, err)
	}
	return platform.OverlayLayersByPath, nil
}

// tryOverlay makes an overlay of fresh scratch directories as how says (by path, with their
// mounts attached in a namespace of its own, as the shim does), writable, or read-only over
// the mount extra if not nil. Each try takes new scratch mounts: a mount attached for one
// is gone with its namespace.
func tryOverlay(how platform.OverlayLayers, extra *os.File) error {
	s, err := newScratch()
	if err != nil {
		return err
	}
	defer s.Close()
	mk := func() error {
		var m *os.File
		var err error
		if extra != nil {
			m, err = platform.NewOverlay(how, []*os.File{extra, s.lower1}, nil, nil, "", unix.MOUNT_ATTR_RDONLY)
		} else {
			m, err = platform.NewOverlay(how, []*os.File{s.lower1, s.lower2}, s.upper, s.work, "index=off,redirect_dir=off,metacopy=off", 0)
		}
		if err == nil {
			m.Close()
		}
		return err
	}
	if how != platform.OverlayLayersByPath {
		return mk()
	}
	holders := []*os.File{s.root}
	if extra != nil {
		holders = append(holders, extra)
	}
	return platform.WithMountsAttached(holders, os.TempDir(), mk)
}

// probeIDMap idmaps, by userns, a detached clone of the directory dir, or a fresh tmpfs if
// dir is "".
func probeIDMap(userns *os.File, dir string) error {
	if dir != "" {
		m, err := idmappedClone(userns, dir)
		if err == nil {
			m.Close()
		}
		return err
	}
	m, err := platform.NewMount("tmpfs", "bothyd-probe", "size=16k,nr_inodes=4,mode=0700",
		unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	defer m.Close()
	return platform.SetMountIDMap(m, userns, false)
}

// idmappedClone clones the mount at dir, detached, and idmaps it by userns.
func idmappedClone(userns *os.File, dir string) (*os.File, error) {
	m, err := platform.CloneMount(nil, dir, false)
	if err != nil {
		return nil, err
	}
	if err := platform.SetMountIDMap(m, userns, false); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// holdUserNamespace returns a user namespace of a child made for the probes, and a stop that
// ends the child. The child executes exe, the runtime's executable (which the sandboxes' init
// executes in its user namespace too), traced (PTRACE_TRACEME), so that it stops at the very
// start of the program and runs none of it: a test binary would otherwise run its tests. It
// is killed by stop, and by the kernel with this process.
func holdUserNamespace(exe string) (*os.File, func(), error) {
	// The tracer is the thread that forks; Go wants its ptrace calls from that thread, and the
	// child is waited for from it too.
	goruntime.LockOSThread()
	cmd := exec.Command(exe) //nolint:noctx // stopped at once, killed by stop
	cmd.Args[0] = "bothyd-probe"
	cmd.Env = []string{}
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m,
		Ptrace: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		goruntime.UnlockOSThread()
		return nil, nil, fmt.Errorf("start a process in a user namespace: %w", err)
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		goruntime.UnlockOSThread()
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if err != nil {
		stop()
		return nil, nil, err
	}
	return ns, func() { ns.Close(); stop() }, nil
}

// kernelRelease is uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return strings.TrimRight(string(u.Release[:]), "\x00")
}
