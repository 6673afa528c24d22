//go:build linux

package shim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"

	"github.com/bothy/bothy/agent"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
)

// agentStage is the argument of the init's second stage, in binaries with cgo (after the
// exec that drops its privileges): bothyd __init agent.
const agentStage = "agent"

// agentConfig is what the init's first stage hands the second on fd 3.
type agentConfig struct {
	Capability []byte            `json:"capability"`
	Env        map[string]string `json:"env,omitempty"`
	Hostname   string            `json:"hostname"`
	CgroupDir  string            `json:"cgroup_dir,omitempty"`
	// WorkloadPids: fds 6 and 7 are the workloads' and the agent's tasks files (cgroup v1),
	// or fd 6 is the workloads' cgroup directory (CgroupV2).
	WorkloadPids bool `json:"workload_pids,omitempty"`
	CgroupV2     bool `json:"cgroup_v2,omitempty"`
}

func initLogf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bothyd init: %s\n", fmt.Sprintf(format, args...))
}

// InitMain is the sandbox's init (bothyd __init [agent]), PID 1 of the sandbox. Its state
// directory is in its configuration, not its argv, which the sandbox can read. It
// sets the sandbox up (root file system, host name, loopback), drops to the sandbox's
// privileges and runs the agent ([agent.Run]). A binary built without cgo drops them on every
// thread in place; one with cgo drops them on its thread and re-executes itself as the
// "agent" stage, which runs the agent. It returns the process exit code.
func InitMain(args []string) int {
	runtime.LockOSThread()
	// Die with the shim: set the signal first, then check that the shim did not die before.
	if err := platform.SetParentDeathSignal(unix.SIGKILL); err != nil {
		initLogf("%v", err)
		return 1
	}
	if !lifelineHeld() {
		initLogf("the shim is gone; exiting")
		return 1
	}
	switch {
	case len(args) == 0:
		// While the first stage waits for the shim's mounts; the exec of a cgo build's
		// second stage undoes it, and its agent pays in full.
		go agent.PrepareSignals()
		if err := initStage(); err != nil {
			initLogf("%v", err)
			return 1
		}
		return 0
	case len(args) == 1 && args[0] == agentStage:
		return agentStageMain()
	}
	initLogf("usage: bothyd %s [%s]", InitCommand, agentStage)
	return 2
}

// lifelineHeld reports whether the shim still holds the write end of the lifeline pipe.
func lifelineHeld() bool {
	fds := []unix.PollFd{{Fd: fdLifeline, Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if err != nil {
		return false
	}
	return n == 0 || fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) == 0
}

// maxConfigMounts bounds the descriptors that the init takes with its configuration.
const maxConfigMounts = 32

// receiveConfig reads the init's configuration, one message on the socket at fd 3 (see
// [sendConfig]), into v and returns the descriptors that came with it, close-on-exec. The
// socket stays open for [settleCgroup]; the caller closes fd 3.
func receiveConfig(v any) ([]*os.File, error) {
	buf := make([]byte, maxConfigSize)
	oob := make([]byte, unix.CmsgSpace(maxConfigMounts*4))
	var (
		n, oobn, flags int
		err            error
	)
	for {
		n, oobn, flags, _, err = unix.Recvmsg(fdConfig, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read configuration: %w", err)
	}
	files, perr := platform.ReceivedFiles(oob[:oobn], "mount")
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, err
	}
	switch {
	case perr != nil:
		return fail(fmt.Errorf("read configuration: %w", perr))
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		return fail(errors.New("read configuration: the message was truncated"))
	case n == 0:
		return fail(errors.New("read configuration: the shim sent none"))
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		return fail(fmt.Errorf("read configuration: %w", err))
	}
	return files, nil
}

// settleCgroup makes the init's cgroup namespace on cgroup v2, rooted at the sandbox's
// cgroup, into which the init was cloned without one (clone3 makes namespaces before it
// places the child: see the shim's startV2). With the workloads' cgroup (spec.WorkloadPids),
// the shim then moves the init into the agent's child and limits the workloads
// (platform.Cgroup.SettleV2): the init asks with one byte on the configuration socket and
// waits for the shim's byte back. The namespace stays rooted at the sandbox's cgroup, so
// the agent sees both children and may clone workloads into theirs. On v1 the clone made the
// namespace already, rooted where the shim's forking thread was: the sandbox's cgroup.
//
// Namespaces are per thread: in a binary without cgo every thread moves; with cgo only this
// one, locked, which is also the one that execs the agent stage, so the whole sandbox gets it
// either way.
func settleCgroup(spec *shimSpec) error {
	if !spec.CgroupV2 {
		return nil
	}
	if _, err := platform.UnshareCgroupNamespace(); err != nil {
		return err
	}
	if !spec.WorkloadPids {
		return nil
	}
	if _, err := unix.Write(fdConfig, []byte{1}); err != nil {
		return fmt.Errorf("ask the shim for the agent's cgroup: %w", err)
	}
	var b [1]byte
	var n int
	err := platform.IgnoringEINTR(func() (err error) {
		n, err = unix.Read(fdConfig, b[:])
		return err
	})
	if err != nil || n != 1 || b[0] != 1 {
		return fmt.Errorf("the shim did not move the init into the agent's cgroup (%d bytes, %v)", n, err)
	}
	return nil
}

// readConfig reads the agent stage's configuration from the pipe at fd 3.
func readConfig(v any) error {
	f := os.NewFile(fdConfig, "config")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	return json.Unmarshal(b, v)
}

func initStage() error {
	var cfg initConfig
	mounts, err := receiveConfig(&cfg)
	if err == nil {
		err = settleCgroup(&cfg.Spec)
	}
	unix.Close(fdConfig)
	if err != nil {
		return err
	}
	defer func() {
		for _, m := range mounts {
			m.Close()
		}
	}()
	spec := &cfg.Spec
	// Opened before the old root goes away: the second stage is exec'd from this file.
	exe, err := openExecutable()
	if err != nil {
		return fmt.Errorf("open own executable: %w", err)
	}
	cgroupDir, err := setupRoot(&cfg, mounts)
	if err != nil {
		return err
	}
	if err := platform.SetHostname(spec.Hostname); err != nil {
		return err
	}
	if err := platform.LoopbackUp(); err != nil {
		return err
	}
	// setupRoot left the working directory at the new root.
	if err := platform.PivotRoot("."); err != nil {
		return err
	}

	acfg := agentConfig{Capability: spec.Capability, Env: spec.Env, Hostname: spec.Hostname, CgroupDir: cgroupDir, WorkloadPids: spec.WorkloadPids, CgroupV2: spec.CgroupV2}
	prog, err := seccompProgram(cfg.Seccomp)
	if err != nil {
		return err
	}

	// A binary built without cgo (bothyd's release build) can change the credentials of
	// every thread at once: the init then drops its privileges in place and becomes the agent
	// without another exec. Otherwise it drops them on this thread and re-executes itself.
	// One stop of the Go runtime (capset on every thread; the filter's TSYNC is the
	// kernel's); each workload's bounding set is dropped on the thread the agent forks it from.
	switch err := platform.LimitProcessCapabilities(platform.DefaultCapabilities); {
	case err == nil:
		if err := platform.SetNoNewPrivs(); err != nil {
			return err
		}
		if err := prog.LoadProcess(); err != nil {
			return err
		}
		exe.Close()
		return runAgent(acfg)
	case !errors.Is(err, platform.ErrAllThreadsUnsupported):
		return err
	}

	// The second stage's configuration goes on a fresh pipe at fd 3.
	next, err := json.Marshal(acfg)
	if err != nil {
		return err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	if _, err := pw.Write(next); err != nil {
		return fmt.Errorf("hand the agent stage its configuration: %w", err)
	}
	pw.Close()
	if int(pr.Fd()) == fdConfig {
		// Already in place (fd 3 was free); it only must survive the exec.
		if _, err := unix.FcntlInt(pr.Fd(), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("configuration pipe: %w", err)
		}
	} else {
		if err := unix.Dup3(int(pr.Fd()), fdConfig, 0); err != nil {
			return fmt.Errorf("dup configuration pipe: %w", err)
		}
		pr.Close()
	}

	// Privileges, on this thread only: the exec that follows replaces every other thread, so
	// the agent and everything it starts inherit them.
	if err := platform.LimitThreadCapabilities(platform.DefaultCapabilities); err != nil {
		return err
	}
	if err := platform.SetNoNewPrivs(); err != nil {
		return err
	}
	if err := prog.LoadThread(); err != nil {
		return err
	}
	argv := []string{"bothyd", InitCommand, agentStage}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	err = execveat(int(exe.Fd()), argv, env)
	// Without this, exe could be collected (closing its descriptor, which another file may
	// then take) before the exec has used it.
	runtime.KeepAlive(exe)
	runtime.KeepAlive(pr)
	return err
}

// seccompProgram decodes the filter that the host-side driver compiled. The sandbox side
// cannot compile one (it links no profile library), and a sandbox never runs unfiltered: a
// configuration without a filter is refused.
func seccompProgram(b []byte) (*platform.SeccompProgram, error) {
	if len(b) == 0 {
		return nil, errors.New("the configuration carries no seccomp filter")
	}
	var p platform.SeccompProgram
	if err := p.UnmarshalBinary(b); err != nil {
		return nil, err
	}
	return &p, nil
}

// openExecutable opens the running executable on a descriptor above the fixed ones (3 and
// 4), which the init reuses for the second stage's configuration.
func openExecutable() (*os.File, error) {
	fd, err := unix.Open("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 10)
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(high), "bothyd"), nil
}

// execveat executes the file open at fd, through its /proc/self/fd link.
func execveat(fd int, argv, env []string) error {
	err := unix.Exec(fmt.Sprintf("/proc/self/fd/%d", fd), argv, env)
	return fmt.Errorf("exec the agent stage: %w", err)
}

func agentStageMain() int {
	var cfg agentConfig
	if err := readConfig(&cfg); err != nil {
		initLogf("%v", err)
		return 1
	}
	if err := runAgent(cfg); err != nil {
		initLogf("%v", err)
		return 1
	}
	return 0
}

// runAgent runs the agent in this process, the sandbox's PID 1, accepting on the control
// socket that the shim made (fd 5).
func runAgent(cfg agentConfig) error {
	// The set-up is over: privileges, no_new_privs and the filter are every thread's now, and
	// the parent-death signal stays with the main thread, which Go never ends. A main
	// goroutine locked to its thread would cost the agent a hand-off of the scheduler at
	// every wait of its own.
	runtime.UnlockOSThread()
	unix.CloseOnExec(fdLifeline)
	var workloadTasks, agentTasks, workloadCgroup *os.File
	switch {
	case cfg.WorkloadPids && cfg.CgroupV2:
		// The workloads' cgroup directory, opened by the shim (platform.Cgroup.SplitV2).
		unix.CloseOnExec(fdWorkloadTasks)
		workloadCgroup = os.NewFile(fdWorkloadTasks, "workloads' cgroup")
	case cfg.WorkloadPids:
		// Opened by the shim, as host root: the kernel judges a move by the opener.
		unix.CloseOnExec(fdWorkloadTasks)
		unix.CloseOnExec(fdAgentTasks)
		workloadTasks, agentTasks = os.NewFile(fdWorkloadTasks, "workload tasks"), os.NewFile(fdAgentTasks, "agent tasks")
	}
	lf := os.NewFile(fdListener, "control socket")
	ln, err := net.FileListener(lf)
	lf.Close() // FileListener holds a duplicate, close-on-exec: no workload inherits it
	if err != nil {
		return fmt.Errorf("the control socket (fd %d): %w", fdListener, err)
	}
	// Not dumpable: a workload, even as root, cannot then reach the agent through /proc/1
	// (its memory holds the capability; its descriptors include sandbox.log on the host and
	// the bothyd executable), since that needs CAP_SYS_PTRACE, which no workload has.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("PR_SET_DUMPABLE: %w", err)
	}
	env := make([]string, 0, len(cfg.Env))
	for k, v := range cfg.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	err = agent.Run(agent.Config{
		Listener:       ln,
		Capability:     cfg.Capability,
		DefaultEnv:     env,
		Hostname:       cfg.Hostname,
		CgroupDir:      cfg.CgroupDir,
		WorkloadTasks:  workloadTasks,
		AgentTasks:     agentTasks,
		WorkloadCgroup: workloadCgroup,
		// The init bounded the capabilities of its own thread only (or, built with cgo, of
		// every thread by an exec): each workload's fork is bounded on its thread.
		WorkloadCapabilities: platform.DefaultCapabilities,
		ReapAll:              true,
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}
