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
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// cloneFlags are the namespaces of a sandbox; a user namespace (CLONE_NEWUSER) joins them
// unless IDConfig.Off.
const cloneFlags = syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS |
	syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET | syscall.CLONE_NEWCGROUP

// initConfig is what the shim hands the init on its fd 3.
type initConfig struct {
	Spec    shimSpec `json:"spec"`
	Seccomp []byte   `json:"seccomp,omitempty"`
	// Binds are where the host directories that come with the configuration (after the
	// overlay, see [rootMounts]) go, below the root.
	Binds []string `json:"binds,omitempty"`
	// Rootfs is the identity of <dir>/rootfs, which the init must have as its working
	// directory.
	Rootfs platform.FileID `json:"rootfs"`
	// UserNamespace says the init runs in a user namespace of its own.
	UserNamespace bool `json:"user_namespace,omitempty"`
}

// maxConfigSize bounds the init's configuration, one message.
const maxConfigSize = 1 << 20

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
	// WorkloadPids says the init has, on cgroup v1, the tasks files of [WorkloadCgroup] and of
	// the sandbox's pids cgroup at fds 6 and 7; on v2, the directory of the workloads' cgroup
	// at fd 6, and it asks the shim to be moved into the agent's ([settleCgroup]).
	WorkloadPids bool `json:"workload_pids,omitempty"`
	// Disk says the writable layer lives on the sandbox's own disk (EntryDiskImage).
	Disk bool `json:"disk,omitempty"`
	// Mounts are the mechanisms the shim builds the root with (Config.Mounts).
	Mounts Mounts `json:"mounts"`
	// Volumes are the volumes' host mounts to clone into the root (see [rootMounts]).
	Volumes []runtime.VolumeMount `json:"volumes,omitempty"`
}

// initCapabilities bound the init: the sandbox's own set (platform.DefaultCapabilities),
// plus CAP_SYS_ADMIN for its mounts, pivot_root and host name, CAP_NET_ADMIN to bring
// loopback up and CAP_SYS_RESOURCE to set its user namespace's max_user_namespaces, all
// dropped before the agent runs.
var initCapabilities = append([]string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE"}, platform.DefaultCapabilities...)

// Fds of the init: 3 carries its configuration (one message on a socket, with the
// descriptors of its root's mounts; see [sendConfig]), 4 is the lifeline, a pipe whose
// write end only the shim holds, so that the init can tell whether the shim still lives, and
// 5 is the control socket, listening, on which the agent accepts bothyd's connections.
const (
	fdConfig   = 3
	fdLifeline = 4
	fdListener = 5
	// 6 and 7, with a pids limit on cgroup v1: the tasks files of [WorkloadCgroup] and of the
	// sandbox's own pids cgroup; 6 alone on v2: the workloads' cgroup directory.
	fdWorkloadTasks = 6
	fdAgentTasks    = 7
)

// ShimMain is the runtime process (bothyd __shim <dir>): it creates the sandbox's cgroup
// and its control socket, starts the init in new namespaces, waits for it, writes the outcome report, removes the
// cgroup and exits. It returns the process exit code.
func ShimMain(args []string) int {
	// The init's parent-death signal fires when the THREAD that forked it exits, so the init is
	// forked from the main thread, which lives as long as the shim does.
	goruntime.LockOSThread()
	// Every file the shim creates gets exactly the mode it asks for (the base layer's /tmp
	// 1777, /etc files 0644, records 0600).
	unix.Umask(0)
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "bothyd %s: want exactly one argument, the state directory\n", ShimCommand)
		return 2
	}
	// A shim that shed its set-up (shed) is back: fd 3 is not a configuration now but one of
	// the descriptors it kept.
	if v, ok := os.LookupEnv(waitStateEnv); ok {
		var ws waitState
		if err := json.Unmarshal([]byte(v), &ws); err != nil || ws.Dir != args[0] {
			fmt.Fprintf(os.Stderr, "bothyd shim: a wait state that is not this shim's (%v)\n", err)
			return 2
		}
		return waitMain(&ws)
	}
	cfgFile := os.NewFile(fdConfig, "config")
	b, err := io.ReadAll(io.LimitReader(cfgFile, 1<<20))
	cfgFile.Close()
	var cfg Config
	if err == nil {
		err = json.Unmarshal(b, &cfg)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bothyd shim: read configuration: %v\n", err)
		return 2
	}
	if cfg.Spec.Dir != args[0] {
		fmt.Fprintf(os.Stderr, "bothyd shim: configuration names %s, argv %s\n", cfg.Spec.Dir, args[0])
		return 2
	}
	return runShim(&cfg)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bothyd shim: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

// runShim runs one launch: it finds the host base (in the background), creates the cgroup,
// starts the init and hands it its configuration, waits for it to end, and reports the
// outcome. It returns the shim's exit code.
func runShim(cfg *Config) int {
	spec := &cfg.Spec
	l := &launch{dir: spec.Dir, releaseSocket: cfg.ReleaseSocket, outcome: runtime.Outcome{LaunchID: spec.LaunchID}}
	// From the start, a TERM, INT or HUP is kept for the init (see wait), not the default
	// death that would take the init along with no outcome written: bothyd or an operator
	// may send one as soon as the agent answers, which can be before the shim waits.
	fw := newForwarder(nil)
	defer signal.Stop(fw.sigc)
	baseDone := findHostBase(spec)
	ids, err := allocateIDs(cfg.IDs)
	if err != nil {
		return l.fail(nil, "%v", err)
	}
	// The slot stays the shim's until it exits, after the init and all of the sandbox are gone.
	defer ids.release()
	if ids != nil {
		logf("user namespace: ids 0-%d are host ids %d-%d (slot %d)", IDRangeSize-1, ids.base, ids.base+IDRangeSize-1, ids.slot)
	}
	cg, err := newCgroup(cfg.Cgroup, spec.Resources)
	if err != nil {
		return l.fail(cg, "%v", err)
	}
	owner := -1
	if ids != nil {
		owner = int(ids.base)
	}
	tasks, err := workloadTasks(cg, spec.Resources.Pids, owner)
	if err != nil {
		return l.fail(cg, "%v", err)
	}
	proc, err := startInit(spec.Dir, cg, ids, tasks)
	for _, f := range tasks {
		f.Close() // the init has its own now
	}
	if err != nil {
		return l.fail(cg, "%v", err)
	}
	// Before the init has its configuration, and so before the agent starts any workload.
	// Where bothyd lacks CAP_SYS_RESOURCE (a container's default set) the agent stays at the
	// shim's score and its workloads above it (agent.WorkloadOOMScoreAdj) still go first.
	if err := platform.SetOOMScoreAdj(proc.cmd.Process.Pid, AgentOOMScoreAdj); err != nil {
		logf("lower the agent's OOM score: %v; it keeps the shim's, below its workloads'", err)
	}
	// The lifeline's write end stays open (close-on-exec) for the shim's whole life.
	defer proc.lifeline.Close()
	werr := proc.configure(spec, <-baseDone, cfg.Seccomp, cfg.Mounts, cg)
	if err := proc.leaveCgroup(); err != nil {
		// The shim's own thread would stay in the sandbox's cgroup, where removing the cgroup
		// at the end would kill the shim itself: end the sandbox, and leave the cgroup to the
		// supervisor's Cleanup once the shim is gone.
		_ = proc.cmd.Process.Kill()
		_ = proc.cmd.Wait()
		return l.fail(nil, "leave cgroup: %v", err)
	}
	var shedding *waitState
	if werr == nil {
		shedding = &waitState{Dir: spec.Dir, LaunchID: spec.LaunchID, Cgroup: cfg.Cgroup, InitPID: proc.cmd.Process.Pid, ReleaseSocket: cfg.ReleaseSocket}
	}
	st, err := proc.wait(fw, shedding)
	if st == nil {
		return l.fail(cg, "wait for the init: %v", err)
	}
	ws, _ := st.Sys().(syscall.WaitStatus)
	l.held = proc.held
	l.recordEnd(ws, cg)
	if werr != nil && !errors.Is(werr, os.ErrClosed) {
		logf("the init was not started: %v", werr)
		l.outcome.Reason = runtime.ReasonStartFailed
	}
	return l.finish(cg)
}

// launch is the outcome of the shim's launch as it builds up, and how it is reported.
type launch struct {
	dir string
	// releaseSocket is [Config.ReleaseSocket].
	releaseSocket string
	outcome       runtime.Outcome
	// held is what the launch releases last (release_linux.go).
	held held
}

// finish removes the cgroup cg, unless it is nil, writes the outcome report, and hands what
// the launch held to a releaser. It returns the shim's exit code: 1 if the report could not
// be written.
func (l *launch) finish(cg *platform.Cgroup) int {
	if cg != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := cg.Remove(ctx); err != nil {
			logf("remove cgroup: %v", err)
		}
		cancel()
	}
	l.outcome.At = time.Now().UTC()
	defer l.held.release(l.dir, l.releaseSocket)
	if err := runtime.WriteOutcome(l.dir, &l.outcome); err != nil {
		logf("write the outcome report: %v", err)
		return 1
	}
	return 0
}

// fail logs why the launch failed and finishes it with a failed start as its outcome.
func (l *launch) fail(cg *platform.Cgroup, format string, args ...any) int {
	logf(format, args...)
	l.outcome.Reason = runtime.ReasonStartFailed
	l.outcome.ExitCode = -1
	l.finish(cg)
	return 1
}

// recordEnd records how the init ended (ws) and whether the kernel killed it for memory,
// which its cgroup cg tells unless nil.
func (l *launch) recordEnd(ws syscall.WaitStatus, cg *platform.Cgroup) {
	o := &l.outcome
	if ws.Exited() {
		o.Reason = runtime.ReasonExited
		o.ExitCode = ws.ExitStatus()
	} else {
		o.Reason = runtime.ReasonSignaled
		o.ExitCode = -1
		o.Signal = unix.SignalName(ws.Signal())
	}
	if cg == nil {
		logf("the sandbox ended: %s (exit code %d, signal %q, OOM not known)", o.Reason, o.ExitCode, o.Signal)
		return
	}
	// OOMKilled says the OOM killer killed a process of the sandbox while it ran, a workload's
	// as well. The reason is oom only when it ended the init, with SIGKILL, counted in the
	// init's cgroup: on v2 the agent's own child, where no workload's kill counts; on v1 the
	// sandbox's, where one does, so that there an init killed by someone else's SIGKILL after
	// a workload's OOM kill is taken for the OOM killer's.
	if oom, err := cg.OOMKilled(); err != nil {
		logf("read OOM state: %v", err)
	} else {
		o.OOMKilled = oom
	}
	if o.OOMKilled && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		if oom, err := cg.AgentOOMKilled(); err != nil {
			logf("read the agent's OOM state: %v", err)
		} else if oom {
			o.Reason = runtime.ReasonOOM
		}
	}
	logf("the sandbox ended: %s (exit code %d, signal %q, oom %v)", o.Reason, o.ExitCode, o.Signal, o.OOMKilled)
}

// hostBaseResult is the host image's base layer, or why it could not be had.
type hostBaseResult struct {
	dir string
	err error
}

// findHostBase finds the host image's base layer, shared by the sandboxes of a state root,
// and makes it if it is not there yet (reading the host and hashing it), while the init
// starts; the init gets it with its configuration. A sandbox of another image needs none.
func findHostBase(spec *runtime.Spec) <-chan hostBaseResult {
	done := make(chan hostBaseResult, 1)
	if spec.ImageDir != "" {
		done <- hostBaseResult{}
		return done
	}
	go func() {
		dir, err := hostBaseFor(spec)
		done <- hostBaseResult{dir, err}
	}()
	return done
}

// newCgroup makes the sandbox's cgroup name with the limits of res, the pids limit raised by
// [AgentPids]. A cgroup of the same name left by a crashed earlier launch goes first, with
// anything still in it, so that its counters (OOM kills) are not taken for this run's. The
// cgroup is returned, with or without an error, once it may exist and must be removed when
// the launch ends.
func newCgroup(name string, res runtime.Resources) (*platform.Cgroup, error) {
	cg, err := platform.OpenCgroup(name)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = cg.Remove(rctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("remove a stale cgroup: %w", err)
	}
	limits := platform.CgroupLimits{
		MemoryBytes: int64(res.MemoryMB) << 20,
		VCPUs:       res.VCPUs,
	}
	if res.Pids > 0 {
		// The agent is in the cgroup too: the workload's limit comes on top of its allowance.
		limits.Pids = res.Pids + AgentPids
		if cg.V2() && limits.MemoryBytes > 0 {
			// On v2 the workloads get a memory cgroup of their own with the sandbox's limit
			// (platform.Cgroup.SettleV2), and the agent its allowance beside it.
			limits.MemoryBytes += AgentMemory
		}
	}
	if err := cg.Create(limits); err != nil {
		return cg, fmt.Errorf("create cgroup: %w", err)
	}
	return cg, nil
}

// workloadTasks makes the workloads' cgroup of a sandbox, limited to pids tasks, and returns
// what the init gets of it (fds 6 and 7), or nothing without a pids limit. On cgroup v1 that
// is the tasks files of [WorkloadCgroup], a child of the sandbox's pids cgroup limited to pids
// and the forking thread, and of the sandbox's pids cgroup; on v2 the directory of the
// child platform.V2WorkloadsCgroup, whose limit [initProcess.configure] writes once the init
// is in the agent's child (platform.Cgroup.SplitV2, which says why owner, the host uid of the
// sandbox's root or -1, may write what it may).
func workloadTasks(cg *platform.Cgroup, pids, owner int) ([]*os.File, error) {
	if pids <= 0 {
		return nil, nil
	}
	if cg.V2() {
		dir, err := cg.SplitV2(owner)
		if err != nil {
			return nil, fmt.Errorf("the workloads' cgroup: %w", err)
		}
		return []*os.File{dir}, nil
	}
	// One more than the workload's limit: the agent's thread that forks a workload is in
	// the cgroup while it forks, and counts.
	child, self, err := cg.PidsChild(WorkloadCgroup, pids+1)
	if err != nil {
		return nil, fmt.Errorf("the workloads' cgroup: %w", err)
	}
	return []*os.File{child, self}, nil
}

// initProcess is the sandbox's init, started by [startInit].
type initProcess struct {
	cmd *exec.Cmd
	// ids is the sandbox's range of host ids, nil without a user namespace.
	ids *idRange
	// rootfs is the identity of <dir>/rootfs, the init's working directory.
	rootfs platform.FileID
	// config is the shim's end of the init's configuration socket (its fd 3).
	config *os.File
	// lifeline is the write end of the init's lifeline (its fd 4), which only the shim holds.
	lifeline *os.File
	// leaveCgroup takes the shim's forking thread out of the sandbox's cgroup again (cgroup
	// v1); on v2 the thread never entered it.
	leaveCgroup func() error
	// workloadPids says the init has the workloads' cgroup's tasks files (fds 6 and 7).
	workloadPids bool
	// held is the sandbox's overlay and the disk's lock once the init has its configuration,
	// for the release (release_linux.go).
	held held
}

// startInit starts the sandbox's init in new namespaces and in the cgroup cg, with its
// configuration pipe, its lifeline and the control socket.
//
// The control socket is made here, on the host, at <dir>/control/control.sock, before the
// init exists: the sandbox never sees that directory (nothing of the state directory is
// mounted inside), so nothing inside can rename, replace or add what bothyd connects to.
// The agent accepts on the listening descriptor it inherits. Its peer credentials, which
// bothyd may check, are the shim's: the process that listened. Once the init has it, the
// shim's own descriptor goes, so that the socket dies with the agent and a client waiting
// in its queue learns so at once.
func startInit(dir string, cg *platform.Cgroup, ids *idRange, tasks []*os.File) (*initProcess, error) {
	ln, err := platform.ListenUnix(filepath.Join(dir, EntryControl, SocketName), 0o600)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	defer ln.Close()
	rootfs, err := platform.OpenDir(rootfsPath(dir))
	if err != nil {
		return nil, err
	}
	defer rootfs.Close()
	rootfsID, err := platform.IDOf(rootfs)
	if err != nil {
		return nil, err
	}
	cw, cr, err := configSocket()
	if err != nil {
		return nil, err
	}
	lr, lw, err := os.Pipe()
	if err != nil {
		cr.Close()
		cw.Close()
		return nil, fmt.Errorf("pipe: %w", err)
	}
	p := &initProcess{cmd: initCommand(cr, lr, ln, tasks, ids), workloadPids: len(tasks) > 0, ids: ids, rootfs: rootfsID, config: cw, lifeline: lw, leaveCgroup: func() error { return nil }}
	err = p.start(cg, rootfs)
	cr.Close()
	lr.Close()
	if err != nil {
		cw.Close()
		lw.Close()
		return nil, err
	}
	return p, nil
}

// configSocket makes the init's configuration channel: a pair of sequenced-packet sockets,
// so that the configuration and the descriptors of its mounts go as one message.
func configSocket() (shimEnd, initEnd *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("configuration socket: %w", err)
	}
	// Room for the largest configuration in one message.
	_ = unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 2*maxConfigSize)
	return os.NewFile(uintptr(fds[0]), "config"), os.NewFile(uintptr(fds[1]), "config"), nil
}

// initCommand is the init's command, its configuration on fd 3 (cr), its lifeline on fd 4
// (lr), the control socket on fd 5 (ln) and the tasks files of [workloadTasks] on 6 and 7,
// in a user namespace of the host ids ids unless nil. Its argv names no host path (the state directory is in its configuration): a sandbox
// can read it. Its working directory is the shim's at the start (see [initProcess.start]).
func initCommand(cr, lr, ln *os.File, tasks []*os.File, ids *idRange) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe", InitCommand) //nolint:noctx // the init lives as long as the sandbox
	cmd.Args[0] = "bothyd"
	cmd.Env = []string{}
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = append([]*os.File{cr, lr, ln}, tasks...)
	// Go's own Pdeathsig cannot be used here: its check against a parent that died early
	// compares getppid() with the parent's pid, and in a new pid namespace getppid() is 0, so
	// the child would always kill itself. The init sets the signal itself and checks the
	// lifeline instead.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneFlags}
	if ids != nil {
		// Ids 0-65535 of the namespace are the range's; host root is none of them. The maps
		// are written (by Go, from the shim) before the init runs anything; setgroups stays
		// allowed so that the agent can give a workload no supplementary groups. The init
		// takes all three of its ids as the namespace's root: its real id would otherwise
		// stay host root's, which no process of a sandbox may have.
		m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(ids.base), Size: IDRangeSize}}
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = m
		cmd.SysProcAttr.GidMappings = m
		cmd.SysProcAttr.GidMappingsEnableSetgroups = true
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 0, Gid: 0}
	}
	return cmd
}

// start starts the init in the cgroup cg, each version of cgroups its own way, in the
// directory rootfs.
//
// The init inherits the working directory (moved into its new mount namespace by the
// kernel): in a user namespace it could not look <dir>/rootfs up itself. The shim, a process
// of its own for one sandbox, goes there for the clone and back to "/" after.
//
// With a user namespace, the clone runs with the forking thread's effective ids set to the
// range's first (platform.AsThreadUser): the kernel makes the clone's creator the owner of
// the new namespace, and counts what the sandbox holds (its user namespaces, inotify
// instances, processes) against its owner in the host's namespace too. Owned by host root,
// a sandbox's root would count against host root's limits.
func (p *initProcess) start(cg *platform.Cgroup, rootfs *os.File) error {
	// The init can never hold more than it needs to set the sandbox up: the forking thread's
	// bounding set goes first. (Without a user namespace it is the init's; a new user
	// namespace starts with a full one, bounded only inside, on each workload's fork.)
	if err := platform.BoundThreadCapabilities(initCapabilities); err != nil {
		return err
	}
	if err := rootfs.Chdir(); err != nil {
		return err
	}
	defer func() {
		if err := os.Chdir("/"); err != nil {
			logf("chdir /: %v", err)
		}
	}()
	if cg.V2() {
		return p.startV2(cg)
	}
	return p.startV1(cg)
}

// spawn starts the init's command, as the owner of its user namespace if it has one.
func (p *initProcess) spawn() error {
	if p.ids == nil {
		return p.cmd.Start()
	}
	return platform.AsThreadUser(int(p.ids.base), int(p.ids.base), p.cmd.Start)
}

// startV2 clones the init into the cgroup (CLONE_INTO_CGROUP). clone3 creates the new
// namespaces before it places the child into the cgroup, so a cgroup namespace made at clone
// would be rooted at the shim's cgroup: the init makes its own once it is in the sandbox's
// cgroup (see mountOwnCgroup).
func (p *initProcess) startV2(cg *platform.Cgroup) error {
	p.cmd.SysProcAttr.Cloneflags &^= syscall.CLONE_NEWCGROUP
	dirf, err := cg.OpenDir()
	if err != nil {
		return fmt.Errorf("open cgroup: %w", err)
	}
	// The clone has used the descriptor by the time Start returns.
	defer dirf.Close()
	p.cmd.SysProcAttr.UseCgroupFD = true
	p.cmd.SysProcAttr.CgroupFD = int(dirf.Fd())
	if err := p.spawn(); err != nil {
		return fmt.Errorf("start the init: %w", err)
	}
	return nil
}

// startV1 forks the init from inside the cgroup: on v1 the forking thread enters the cgroup
// for the fork only, so the init is born in the cgroup and its new cgroup namespace is rooted
// there. The thread leaves again (leaveCgroup) once the init has its configuration, off the
// init's critical path.
func (p *initProcess) startV1(cg *platform.Cgroup) error {
	leave, err := cg.EnterThread()
	if err != nil {
		return fmt.Errorf("enter cgroup: %w", err)
	}
	if err := p.spawn(); err != nil {
		if lerr := leave(); lerr != nil {
			logf("leave cgroup: %v", lerr)
		}
		return fmt.Errorf("start the init: %w", err)
	}
	p.leaveCgroup = leave
	return nil
}

// configure makes the mounts of the sandbox's root (see [rootMounts]), with the host base b,
// and hands them to the init with its configuration and the compiled seccomp filter, and
// closes the socket. An init that cannot have them is killed; the error says why.
func (p *initProcess) configure(spec *runtime.Spec, b hostBaseResult, seccomp []byte, mech Mounts, cg *platform.Cgroup) error {
	v2 := cg.V2()
	err := b.err
	if err != nil {
		logf("build the host image: %v", err)
	} else {
		ss := shimSpec{
			ID: spec.ID, Dir: spec.Dir, ImageDir: spec.ImageDir, BaseDir: b.dir, Lowers: spec.Lowers,
			Env: spec.Env, Capability: spec.Capability, Hostname: spec.Hostname, CgroupV2: v2, Disk: spec.DiskMB > 0,
			WorkloadPids: p.workloadPids, Mounts: mech, Volumes: spec.Volumes,
		}
		var mounts *rootMounts
		mounts, err = p.makeMounts(&ss)
		if err == nil {
			var icfg []byte
			icfg, err = json.Marshal(initConfig{Spec: ss, Seccomp: seccomp, Binds: mounts.bindPaths, Rootfs: p.rootfs, UserNamespace: p.ids != nil})
			if err == nil {
				err = sendConfig(p.config, icfg, mounts.files())
			}
			if err == nil {
				p.held = mounts.keep()
			}
			mounts.Close()
			if err == nil && v2 && p.workloadPids {
				err = p.settleV2(cg, spec.Resources.Pids, int64(spec.Resources.MemoryMB)<<20)
			}
		}
	}
	p.config.Close()
	if err != nil {
		_ = p.cmd.Process.Kill()
	}
	return err
}

// settleV2 answers the init's request (one byte on the configuration socket, sent once it
// made its cgroup namespace in the sandbox's cgroup; see settleCgroup) by moving it into the
// agent's child and limiting the workloads' child to pids tasks and the sandbox's memory
// (platform.Cgroup.SettleV2),
// and tells it so with one byte back. An init that ends first closes its end: the read fails.
func (p *initProcess) settleV2(cg *platform.Cgroup, pids int, memoryBytes int64) error {
	var b [1]byte
	if n, err := p.config.Read(b[:]); n != 1 || b[0] != 1 {
		return fmt.Errorf("the init did not ask for its cgroup (%d bytes, %v)", n, err)
	}
	if err := cg.SettleV2(p.cmd.Process.Pid, pids, memoryBytes); err != nil {
		return fmt.Errorf("the agent's and the workloads' cgroups: %w", err)
	}
	if _, err := p.config.Write(b[:]); err != nil {
		return fmt.Errorf("tell the init its cgroup: %w", err)
	}
	return nil
}

// makeMounts makes the mounts of the sandbox's root, idmapped by the init's user namespace
// if it has one.
func (p *initProcess) makeMounts(ss *shimSpec) (*rootMounts, error) {
	if p.ids == nil {
		return makeRootMounts(ss, nil, nil)
	}
	userns, err := openUserNamespace(p.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	defer userns.Close()
	return makeRootMounts(ss, userns, p.ids)
}

// sendConfig sends the init its configuration cfg with the descriptors files, as one message.
func sendConfig(sock *os.File, cfg []byte, files []*os.File) error {
	if len(cfg) > maxConfigSize || len(files) > maxConfigMounts {
		return fmt.Errorf("the configuration is too large (%d bytes, %d mounts)", len(cfg), len(files))
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), cfg, unix.UnixRights(fds...), nil, 0)
		return serr != unix.EAGAIN
	})
	goruntime.KeepAlive(files)
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("hand the init its configuration: %w", err)
	}
	return nil
}

// wait waits for the init to end. A TERM or INT for the shim (an operator, a service manager
// stopping everything) asks the sandbox to shut down gracefully meanwhile: it goes to the
// init, whose agent ends the sandbox's processes; the shim stays to record the outcome. Dying
// instead would take the init along (its parent-death signal) with no outcome written.
//
// fw has caught those signals since the shim started. With shedding, a sandbox still running
// after shedAfter makes the shim shed its set-up (shed), and wait then never returns: the
// waiter reports the end.
func (p *initProcess) wait(fw *forwarder, shedding *waitState) (*os.ProcessState, error) {
	fw.send = func() error { return p.cmd.Process.Signal(syscall.SIGTERM) }
	fw.start()
	if shedding != nil && p.settled(shedAfter) {
		err := p.shed(fw, *shedding)
		logf("the shim keeps its set-up: %v", err)
		// The shim now only waits, possibly for weeks: give the memory of the set-up back, as
		// the shed would have. Not sooner: a sandbox that ends within shedAfter would pay
		// for a forced collection (about 1 ms of CPU) that frees nothing anyone waits for.
		debug.FreeOSMemory()
	}
	err := p.cmd.Wait()
	fw.stop()
	return p.cmd.ProcessState, err
}
