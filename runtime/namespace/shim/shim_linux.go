//go:build linux

package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	goruntime "runtime"
	"runtime/debug"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/platform"
	"github.com/sandboxd/sandboxd/runtime"
)

// cloneFlags are the namespaces of a sandbox. A user namespace is not among them: the runtime
// requires root (see New).
const cloneFlags = syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS |
	syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET | syscall.CLONE_NEWCGROUP

// initConfig is what the shim hands the init on its fd 3.
type initConfig struct {
	Spec    shimSpec `json:"spec"`
	Seccomp []byte   `json:"seccomp,omitempty"`
}

// shimSpec is the part of the spec the init needs.
type shimSpec struct {
	ID       string `json:"id"`
	Dir      string `json:"dir"`
	ImageDir string `json:"image_dir,omitempty"`
	// BaseDir is the host image's base layer when ImageDir is "".
	BaseDir    string            `json:"base_dir,omitempty"`
	Lowers     []string          `json:"lowers,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Capability []byte            `json:"capability"`
	Hostname   string            `json:"hostname"`
	// CgroupV2 says which kind of cgroup to mount inside for the agent.
	CgroupV2 bool `json:"cgroup_v2,omitempty"`
	// Disk says the writable layer lives on the sandbox's own disk (EntryDiskImage).
	Disk bool `json:"disk,omitempty"`
}

// initCapabilities bound the init: the sandbox's own set (platform.DefaultCapabilities),
// plus CAP_SYS_ADMIN for its mounts, pivot_root and host name and CAP_NET_ADMIN to bring
// loopback up, both dropped before the agent runs.
var initCapabilities = append([]string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN"}, platform.DefaultCapabilities...)

// Fds of the init: 3 carries its configuration (then EOF), 4 is the lifeline, a pipe whose
// write end only the shim holds, so that the init can tell whether the shim still lives.
const (
	fdConfig   = 3
	fdLifeline = 4
)

// ShimMain is the runtime process (sandboxd __shim <dir>): it creates the sandbox's cgroup,
// starts the init in new namespaces, waits for it, writes the outcome report, removes the
// cgroup and exits. It returns the process exit code.
func ShimMain(args []string) int {
	// The init's parent-death signal fires when the THREAD that forked it exits, so the init is
	// forked from the main thread, which lives as long as the shim does.
	goruntime.LockOSThread()
	// Every file the shim creates gets exactly the mode it asks for (the base layer's /tmp
	// 1777, /etc files 0644, records 0600).
	unix.Umask(0)
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "sandboxd %s: want exactly one argument, the state directory\n", ShimCommand)
		return 2
	}
	cfgFile := os.NewFile(fdConfig, "config")
	b, err := io.ReadAll(io.LimitReader(cfgFile, 1<<20))
	cfgFile.Close()
	var cfg Config
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandboxd shim: read configuration: %v\n", err)
		return 2
	}
	if cfg.Spec.Dir != args[0] {
		fmt.Fprintf(os.Stderr, "sandboxd shim: configuration names %s, argv %s\n", cfg.Spec.Dir, args[0])
		return 2
	}
	return runShim(&cfg)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s sandboxd shim: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

func runShim(cfg *Config) int {
	spec := &cfg.Spec
	outcome := &runtime.Outcome{LaunchID: spec.LaunchID}
	finish := func(cg *platform.Cgroup) int {
		if cg != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := cg.Remove(ctx); err != nil {
				logf("remove cgroup: %v", err)
			}
			cancel()
		}
		outcome.At = time.Now().UTC()
		if err := runtime.WriteOutcome(spec.Dir, outcome); err != nil {
			logf("write the outcome report: %v", err)
			return 1
		}
		return 0
	}
	fail := func(cg *platform.Cgroup, format string, args ...any) int {
		logf(format, args...)
		outcome.Reason = runtime.ReasonStartFailed
		outcome.ExitCode = -1
		finish(cg)
		return 1
	}

	// The host image's base layer, shared by the sandboxes of a state root, is found (read
	// from the host and hashed) and made if it is not there yet while the init starts; the
	// init gets it with its configuration.
	type base struct {
		dir string
		err error
	}
	baseDone := make(chan base, 1)
	if spec.ImageDir == "" {
		go func() {
			dir, err := hostBaseFor(spec)
			baseDone <- base{dir, err}
		}()
	} else {
		baseDone <- base{}
	}

	cg, err := platform.OpenCgroup(cfg.Cgroup)
	if err != nil {
		return fail(nil, "cgroup: %v", err)
	}
	// A cgroup of the same name left by a crashed earlier launch goes first, with anything
	// still in it, so that its counters (OOM kills) are not taken for this run's.
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = cg.Remove(rctx)
	cancel()
	if err != nil {
		return fail(nil, "remove a stale cgroup: %v", err)
	}
	limits := platform.CgroupLimits{
		MemoryBytes: int64(spec.Resources.MemoryMB) << 20,
		VCPUs:       spec.Resources.VCPUs,
		Pids:        spec.Resources.Pids,
	}
	if err := cg.Create(limits); err != nil {
		return fail(cg, "create cgroup: %v", err)
	}

	cr, cw, err := os.Pipe()
	if err != nil {
		return fail(cg, "pipe: %v", err)
	}
	lr, lw, err := os.Pipe()
	if err != nil {
		return fail(cg, "pipe: %v", err)
	}
	// lw stays open (close-on-exec) for the shim's whole life: it is the init's lifeline.
	defer lw.Close()

	cmd := exec.Command("/proc/self/exe", InitCommand, spec.Dir) //nolint:noctx // the init lives as long as the sandbox
	cmd.Args[0] = "sandboxd"
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{cr, lr}
	// Go's own Pdeathsig cannot be used here: its check against a parent that died early
	// compares getppid() with the parent's pid, and in a new pid namespace getppid() is 0, so
	// the child would always kill itself. The init sets the signal itself and checks the
	// lifeline instead.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneFlags}
	// The init can never hold more than it needs to set the sandbox up: the forking thread's
	// bounding set goes first, so that the init has only a few capabilities left to drop
	// (each drop stops all its threads).
	if err := platform.BoundThreadCapabilities(initCapabilities); err != nil {
		return fail(cg, "%v", err)
	}
	leaveCgroup := func() error { return nil }
	if cg.V2() {
		// clone3 creates the new namespaces before it places the child into the cgroup, so a
		// cgroup namespace made at clone would be rooted at the shim's cgroup: the init makes
		// its own once it is in the sandbox's cgroup (see mountOwnCgroup).
		cmd.SysProcAttr.Cloneflags &^= syscall.CLONE_NEWCGROUP
		dirf, err := cg.OpenDir()
		if err != nil {
			return fail(cg, "open cgroup: %v", err)
		}
		defer dirf.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(dirf.Fd())
		err = cmd.Start()
		if err != nil {
			return fail(cg, "start the init: %v", err)
		}
	} else {
		// On v1 the forking thread enters the cgroup for the fork only: the init is born in
		// the cgroup, and its new cgroup namespace is rooted there. The thread leaves again
		// once the init has its configuration, off the init's critical path.
		leave, err := cg.EnterThread()
		if err != nil {
			return fail(cg, "enter cgroup: %v", err)
		}
		err = cmd.Start()
		if err != nil {
			if lerr := leave(); lerr != nil {
				logf("leave cgroup: %v", lerr)
			}
			return fail(cg, "start the init: %v", err)
		}
		leaveCgroup = leave
	}
	cr.Close()
	lr.Close()
	b := <-baseDone
	werr := b.err
	if werr != nil {
		logf("build the host image: %v", werr)
	} else {
		var icfg []byte
		icfg, werr = json.Marshal(initConfig{Spec: shimSpec{
			ID: spec.ID, Dir: spec.Dir, ImageDir: spec.ImageDir, BaseDir: b.dir, Lowers: spec.Lowers,
			Env: spec.Env, Capability: spec.Capability, Hostname: spec.Hostname, CgroupV2: cg.V2(), Disk: spec.DiskMB > 0,
		}, Seccomp: cfg.Seccomp})
		if werr == nil {
			_, werr = cw.Write(icfg)
		}
	}
	cw.Close()
	if werr != nil {
		_ = cmd.Process.Kill()
	}
	if err := leaveCgroup(); err != nil {
		// The shim's own thread would stay in the sandbox's cgroup, where removing the cgroup
		// at the end would kill the shim itself: end the sandbox, and leave the cgroup to the
		// supervisor's Cleanup once the shim is gone.
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fail(nil, "leave cgroup: %v", err)
	}

	// A TERM or INT for the shim (an operator, a service manager stopping everything) asks
	// the sandbox to shut down gracefully: it goes to the init, whose agent ends the sandbox's
	// processes; the shim stays to record the outcome. Dying instead would take the init
	// along (its parent-death signal) with no outcome written.
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for sig := range sigc {
			logf("forwarding %v to the sandbox", sig)
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
	}()
	// The shim now only waits, possibly for weeks: give the memory of the set-up back.
	debug.FreeOSMemory()
	waitErr := cmd.Wait()
	signal.Stop(sigc)
	st := cmd.ProcessState
	switch {
	case st == nil:
		return fail(cg, "wait for the init: %v", waitErr)
	case st.Exited():
		outcome.Reason = runtime.ReasonExited
		outcome.ExitCode = st.ExitCode()
	default:
		ws, _ := st.Sys().(syscall.WaitStatus)
		outcome.Reason = runtime.ReasonSignaled
		outcome.ExitCode = -1
		outcome.Signal = unix.SignalName(ws.Signal())
	}
	if oom, err := cg.OOMKilled(); err != nil {
		logf("read OOM state: %v", err)
	} else if oom {
		outcome.OOMKilled = true
		if outcome.Reason == runtime.ReasonSignaled {
			outcome.Reason = runtime.ReasonOOM
		}
	}
	logf("the sandbox ended: %s (exit code %d, signal %q, oom %v)", outcome.Reason, outcome.ExitCode, outcome.Signal, outcome.OOMKilled)
	if werr != nil && !errors.Is(werr, os.ErrClosed) {
		logf("the init was not started: %v", werr)
		outcome.Reason = runtime.ReasonStartFailed
	}
	return finish(cg)
}
