//go:build linux

package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/sandboxd/sandboxd/errcode"
	"github.com/sandboxd/sandboxd/platform"
)

// SpawnDetached starts a runtime process for a launch, the way every runtime's Start does:
// exe with args (argv[0] "sandboxd"), in its own session so that it outlives sandboxd and
// no terminal signal of sandboxd's reaches it, in /, with a minimal PATH, stdout and stderr
// to log, and config written on a pipe that is its fd 3 (so the capability it carries never
// lies in a file). It returns the process's verified identity once it has taken its
// configuration. A process that ends as it starts (killed from outside) is start-timeout:
// the sandbox did not come up, and a new start may be tried. kind names the runtime in
// errors.
func SpawnDetached(kind, exe string, args []string, log *os.File, config []byte) (platform.ProcessID, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return platform.ProcessID{}, err
	}
	defer pw.Close()
	cmd := exec.Command(exe, args...) //nolint:noctx // the runtime process outlives every request, and sandboxd
	cmd.Args[0] = "sandboxd"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{pr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	pr.Close()
	if err != nil {
		return platform.ProcessID{}, fmt.Errorf("%s runtime: start the runtime process: %w", kind, err)
	}
	// Reap it if it ends while this sandboxd still runs; after a restart of sandboxd the
	// host's init (or a subreaper) does.
	go func() { _ = cmd.Wait() }()
	id, err := platform.Identify(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		return platform.ProcessID{}, errcode.Wrap(errcode.StartTimeout, err, "The sandbox's runtime process ended as it started (identify: %v); start it again.", err)
	}
	if _, err := pw.Write(config); err != nil {
		_ = platform.SignalVerified(id, syscall.SIGKILL)
		return platform.ProcessID{}, errcode.Wrap(errcode.StartTimeout, err, "The sandbox's runtime process ended before it took its configuration (%v); start it again.", err)
	}
	return id, nil
}
