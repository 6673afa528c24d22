//go:build linux

package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// RuntimeCgroup is the leaf cgroup, below the cgroup parent, that bothyd starts the processes
// that must outlive it in on cgroup v2 ([SpawnDetached]). It is no sandbox's: a sandbox's
// cgroup is <parent>/<id>.<hash>, and `bothyd check` tells them apart by that dot.
const RuntimeCgroup = "runtime"

// SpawnDetached starts a runtime process for a launch, the way every runtime's Start does:
// exe with args (argv[0] "bothyd"), in its own session so that it outlives bothyd and
// no terminal signal of bothyd's reaches it, in /, with a minimal PATH, stdout and stderr
// to log, and config written on a pipe that is its fd 3 (so the capability it carries never
// lies in a file). It returns the process's verified identity once it has taken its
// configuration. A process that ends as it starts (killed from outside) is start-timeout:
// the sandbox did not come up, and a new start may be tried. kind names the runtime in
// errors.
//
// With a cgroup parent on cgroup v2, the process starts in the leaf <cgroupParent>/runtime
// ([RuntimeCgroup], made if missing) by CLONE_INTO_CGROUP, never in bothyd's own cgroup:
// under systemd, a stop or restart of bothyd's unit kills every process of its cgroup, and
// what SpawnDetached starts (shims, releasers, microVM runtime processes) must outlive bothyd.
// On v1 nothing changes: there, systemd's stop of a unit with cgroup v1 hierarchies still
// kills by its own (named) hierarchy, which bothyd does not run on, and the hosts bothyd
// runs on with v1 have no systemd (docs/architecture.md, "cgroups").
func SpawnDetached(kind, exe string, args []string, log *os.File, config []byte, cgroupParent string) (platform.ProcessID, error) {
	attr := &syscall.SysProcAttr{Setsid: true}
	if cgroupParent != "" {
		cg, err := platform.OpenCgroup(cgroupParent + "/" + RuntimeCgroup)
		if err != nil {
			return platform.ProcessID{}, fmt.Errorf("%s runtime: the runtime processes' cgroup: %w", kind, err)
		}
		if cg.V2() {
			dir, err := cg.OpenLeaf()
			if err != nil {
				return platform.ProcessID{}, fmt.Errorf("%s runtime: the runtime processes' cgroup: %w", kind, err)
			}
			// The clone has used it by the time Start returns.
			defer dir.Close()
			attr.UseCgroupFD = true
			attr.CgroupFD = int(dir.Fd())
		}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return platform.ProcessID{}, err
	}
	defer pw.Close()
	cmd := exec.Command(exe, args...) //nolint:noctx // the runtime process outlives every request, and bothyd
	cmd.Args[0] = "bothyd"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{pr}
	cmd.SysProcAttr = attr
	err = cmd.Start()
	pr.Close()
	if err != nil {
		return platform.ProcessID{}, fmt.Errorf("%s runtime: start the runtime process: %w", kind, err)
	}
	id, err := platform.Identify(cmd.Process.Pid)
	// Reap it if it ends while this bothyd still runs; after a restart of bothyd the
	// host's init (or a subreaper) does.
	if err != nil {
		_ = cmd.Process.Kill()
		reap(cmd)
		return platform.ProcessID{}, errcode.Wrap(errcode.StartTimeout, err, "The sandbox's runtime process ended as it started (identify: %v); start it again.", err)
	}
	reap(cmd)
	if _, err := pw.Write(config); err != nil {
		_ = platform.SignalVerified(id, syscall.SIGKILL)
		return platform.ProcessID{}, errcode.Wrap(errcode.StartTimeout, err, "The sandbox's runtime process ended before it took its configuration (%v); start it again.", err)
	}
	return id, nil
}

// reap reaps cmd's process once it ends, without an OS thread of bothyd's blocked in a wait
// for it: cmd.Wait blocks one thread per child, and every running sandbox is a child of the
// bothyd that started it, so 4000 sandboxes held 4000 threads of bothyd, each a host pid
// (kernel.pid_max is 32768 by default) and about 50 KiB of host memory (issue 17). A pidfd is
// readable once its process ended, so the runtime's poller waits for all of them on one
// epoll; the wait itself then does not block. Where pidfds are missing (Linux before 5.3)
// it falls back to cmd.Wait.
func reap(cmd *exec.Cmd) {
	fd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		go func() { _ = cmd.Wait() }()
		return
	}
	pidfd := os.NewFile(uintptr(fd), "pidfd")
	rc, err := pidfd.SyscallConn()
	if err != nil {
		pidfd.Close()
		go func() { _ = cmd.Wait() }()
		return
	}
	// The pidfd os/exec holds for the process would be a second descriptor per sandbox.
	_ = cmd.Process.Release()
	go func() {
		defer pidfd.Close()
		_ = rc.Read(func(fd uintptr) bool {
			var info unix.Siginfo
			var err error = unix.EINTR
			for err == unix.EINTR {
				err = unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG, nil)
			}
			// Nothing to reap yet leaves info zero: wait until the pidfd is readable.
			return err != nil || info.Signo != 0
		})
	}()
}
