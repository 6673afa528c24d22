//go:build linux

package shim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// The volumes of a microVM (docs/volumes.md, "The microVM runtime"): each is served to the
// guest by a virtiofsd of its own over vhost-user, started by the shim for each run of QEMU.
// virtiofsd runs as root on the host, so what it may reach is decided here and by its own
// sandbox, never by the guest:
//
//   - It serves the volume's host mount and nothing else: with -o sandbox=namespace it
//     pivots into that directory in mount, PID and network namespaces of its own, so no
//     path the guest sends (.., an absolute link, which the guest resolves itself) leads
//     outside it.
//   - A read-only mount is read-only on the host: the helper ([fsdMain]) binds the volume
//     read-only in a mount namespace of its own before it becomes virtiofsd, so every write
//     the guest sends fails with EROFS in the host's kernel, whatever the guest's root does
//     to its own mount.
//   - Ownership passes through: the guest's uid and gid are what virtiofsd creates files
//     with, so the sandbox user (1000 in the guest) owns what it writes (1000 on the
//     volume's file system), as it does from the namespace runtime's idmapped mounts.
//   - It makes no device nodes (-o modcaps=-mknod) and keeps no extended attributes
//     (-o no_xattr); the volume's host mount is nosuid and nodev besides.
//   - cache=none: the guest caches neither data nor attributes, so it sees another
//     sandbox's writes at once, as namespace sandboxes do (the cost: every read and write
//     is a round trip to the host, and a shared writable mmap of a volume file fails).

// fsSocketName is the rendezvous of the i-th volume's virtiofsd in the control directory,
// removed as soon as QEMU's end of it is connected.
func fsSocketName(i int) string { return "vfs" + strconv.Itoa(i) + ".sock" }

// fsd is one volume's virtiofsd of a run of QEMU.
type fsd struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startFSDs starts a virtiofsd for each volume of the launch and returns QEMU's ends of their
// vhost-user connections (the i-th volume's first) and the virtiofsds. Each connection is
// made before its virtiofsd starts, so the one it accepts is QEMU's: the listening socket lies
// in the control directory (0700) only until then.
func (v *vm) startFSDs() (conns []*os.File, fsds []*fsd, err error) {
	defer func() {
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			stopFSDs(fsds)
			conns, fsds = nil, nil
		}
	}()
	for i, m := range v.cfg.Spec.Volumes {
		ln, conn, err := fsRendezvous(filepath.Join(v.cfg.Spec.Dir, EntryControl, fsSocketName(i)))
		if err != nil {
			return conns, fsds, fmt.Errorf("volume %s: %w", m.Target, err)
		}
		conns = append(conns, conn)
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		// /proc/self/exe is the shim's own binary, even if bothyd was replaced since.
		cmd := exec.Command("/proc/self/exe", FSCommand, m.Source, mode, v.cfg.VirtioFSD) //nolint:noctx // it lives as long as its run of QEMU
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		cmd.ExtraFiles = []*os.File{ln}
		// It dies with the shim, as QEMU does.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err = cmd.Start()
		ln.Close()
		if err != nil {
			return conns, fsds, fmt.Errorf("start virtiofsd for volume %s: %w", m.Target, err)
		}
		f := &fsd{cmd: cmd, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(f.done) }()
		fsds = append(fsds, f)
	}
	return conns, fsds, nil
}

// stopFSDs ends virtiofsds whose QEMU did not start (a virtiofsd whose QEMU ran ends when
// QEMU's connection closes).
func stopFSDs(fsds []*fsd) {
	for _, f := range fsds {
		_ = f.cmd.Process.Kill()
		<-f.done
	}
}

// fsRendezvous listens on a unix socket at path, connects to it, and removes the path: the
// listener is virtiofsd's (--fd), the connection QEMU's (its chardev's fd).
func fsRendezvous(path string) (ln, conn *os.File, err error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	lfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	ln = os.NewFile(uintptr(lfd), "virtiofsd listener")
	defer os.Remove(path)
	if err := unix.Bind(lfd, &unix.SockaddrUnix{Name: path}); err != nil {
		ln.Close()
		return nil, nil, err
	}
	if err := unix.Listen(lfd, 1); err != nil {
		ln.Close()
		return nil, nil, err
	}
	cfd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	conn = os.NewFile(uintptr(cfd), "vhost-user connection")
	if err := unix.Connect(cfd, &unix.SockaddrUnix{Name: path}); err != nil {
		ln.Close()
		conn.Close()
		return nil, nil, err
	}
	return ln, conn, nil
}

// fsdMain is the volume helper: bothyd __vmfsd <source> rw|ro <virtiofsd>, with the
// listening vhost-user socket on fd 3. In a mount namespace of its own it binds the volume's
// host mount read-only for "ro" (the host kernel then refuses every write, whatever the guest
// sends), and becomes virtiofsd serving it.
func fsdMain(args []string) int {
	if len(args) != 3 || (args[1] != "rw" && args[1] != "ro") || !filepath.IsAbs(args[0]) || !filepath.IsAbs(args[2]) {
		fmt.Fprintf(os.Stderr, "bothyd %s: want <source> rw|ro <virtiofsd>\n", FSCommand)
		return 2
	}
	source, mode, virtiofsd := args[0], args[1], args[2]
	// The mount namespace is the thread's: the same thread unshares, mounts and execs.
	goruntime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		logf("virtiofsd helper: unshare the mount namespace: %v", err)
		return 1
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		logf("virtiofsd helper: make the mounts private: %v", err)
		return 1
	}
	if mode == "ro" {
		if err := unix.Mount(source, source, "", unix.MS_BIND, ""); err != nil {
			logf("virtiofsd helper: bind %s: %v", source, err)
			return 1
		}
		if err := unix.Mount("", source, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			logf("virtiofsd helper: make %s read-only: %v", source, err)
			return 1
		}
	}
	argv := []string{virtiofsd, "--fd=3", "-o", "source=" + source, "-o", "cache=none", "-o", "sandbox=namespace",
		"-o", "no_xattr", "-o", "no_posix_lock", "-o", "no_flock", "-o", "modcaps=-mknod", "-o", "log_level=warn"}
	err := unix.Exec(virtiofsd, argv, os.Environ())
	logf("virtiofsd helper: exec %s: %v", virtiofsd, err)
	return 1
}
