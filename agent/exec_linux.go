package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/platform"
)

// Exec implements control.Handler.
func (a *agent) Exec(ctx context.Context, req *control.ExecRequest, s *control.ExecStream) (control.ExitStatus, error) {
	if a.stopping.Load() {
		return control.ExitStatus{}, control.ErrShuttingDown
	}
	name, u := a.user(req.User)
	env := a.env(name, u, req)
	dir := req.Cwd
	if dir == "" {
		dir = u.Home
	}
	if err := a.checkCwd(req.User, dir); err != nil {
		return control.ExitStatus{}, err
	}
	argv0, err := lookPath(req.Argv[0], envValue(env, "PATH"), dir)
	if err != nil {
		return control.ExitStatus{}, err
	}
	attr := &syscall.SysProcAttr{}
	if !a.unprivileged {
		// An empty (non-nil) group list drops the agent's supplementary groups.
		attr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
	}

	w := &workload{a: a, tty: req.TTY}
	files, err := w.setupIO(req, s.StdoutPipe(), attr)
	if err != nil {
		return control.ExitStatus{}, err
	}
	defer w.closeAll()
	oomBefore, _ := a.oomKills()

	umask := int(req.EffectiveUmask())
	pid, exited, err := a.reaper.start(func() (int, error) {
		p, err := a.startWorkload(umask, argv0, req.Argv, &os.ProcAttr{Dir: dir, Env: env, Files: files, Sys: attr})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		a.raiseOOMScore(pid)
		// The reaper collects the status; the handle (a pidfd) is not needed.
		p.Release()
		return pid, nil
	})
	if err != nil {
		return control.ExitStatus{}, startError(err, req.Argv[0])
	}
	w.pid = pid
	a.mu.Lock()
	a.workloads[pid] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.workloads, pid)
		a.mu.Unlock()
	}()
	w.closeChildEnds()
	if err := s.Started(pid); err != nil {
		// The client is already gone.
		w.kill()
		<-exited
		return control.ExitStatus{}, err
	}
	pumps := w.startPumps(s)

	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var (
		ws       unix.WaitStatus
		timedOut bool
		gone     = ctx.Done()
	)
wait:
	for {
		select {
		case ws = <-exited:
			break wait
		case <-timeout:
			timedOut = true
			timeout = nil
			w.kill()
		case <-gone:
			// The protocol's rule: the client is gone, nobody will read the output, so the
			// workload ends.
			gone = nil
			w.kill()
		case name := <-s.Signals():
			w.signal(name)
		case size := <-s.Resizes():
			w.resize(size)
		}
	}
	w.exited.Store(true)
	w.armDrain()
	pumps.Wait()

	st := control.ExitStatus{TimedOut: timedOut}
	switch {
	case ws.Exited():
		st.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		sig := ws.Signal()
		st.ExitCode = 128 + int(sig)
		st.Signal = strings.TrimPrefix(unix.SignalName(sig), "SIG")
	}
	if oomAfter, ok := a.oomKills(); ok {
		st.OOM = endedByOOM(st, oomAfter > oomBefore)
	}
	return st, nil
}

// endedByOOM says whether an exec that ended as st was ended by the OOM killer, given whether
// the workloads' cgroup counted an OOM kill while it ran (killed). The counter is the
// cgroup's, not the exec's: the kernel says how many of the cgroup's processes it killed, not
// which. So the kill is the exec's when one was counted between its start and its end and the
// exec ended as a SIGKILL ends a command: its own process killed by SIGKILL, or an exit with
// 137 (128 + SIGKILL), which is how a shell reports the kill of the process it waited for
// (`sh -c 'head -c 200m /dev/zero | tail'`, whose tail the kernel killed). An exec that
// timed out was killed by the agent. What this cannot tell apart is said in
// docs/architecture.md ("Out of memory").
func endedByOOM(st control.ExitStatus, killed bool) bool {
	if !killed || st.TimedOut {
		return false
	}
	return st.Signal == "KILL" || st.Signal == "" && st.ExitCode == 128+int(unix.SIGKILL)
}

// raiseOOMScore gives the workload pid, just started, [WorkloadOOMScoreAdj]. Its pid is
// still its own: the reaper reaps it only once it exits, and a pid freed that fast and taken
// again would be another process of the same sandbox, whose score may go up too. A workload
// that already ended answers ESRCH, which is no failure. Any other failure leaves the
// workload at the agent's score, weighed against it by size: logged once, since it is the
// sandbox's (no /proc, or a kernel that refuses), not this workload's.
func (a *agent) raiseOOMScore(pid int) {
	err := platform.SetOOMScoreAdj(pid, WorkloadOOMScoreAdj)
	if err == nil || errors.Is(err, unix.ESRCH) || errors.Is(err, fs.ErrNotExist) {
		return
	}
	a.oomScoreFailed.Do(func() {
		a.log.Warn("a workload keeps the agent's OOM score: the OOM killer weighs the two by size alone", "err", err)
	})
}

// umaskMu serialises the forks that set the umask: it belongs to the whole process (every
// thread of the agent shares it), and several agents may share a process in tests.
var umaskMu sync.Mutex

// startWithUmask starts a process with the given umask. The workload must not inherit the
// agent's own mask (0 as the sandbox's init: the shim creates everything with exact modes),
// or every file and directory it makes would be writable by everyone, and the sandbox's user
// could replace what root runs later. Go cannot set a child's umask between fork and exec,
// so the process's mask is set around the fork and restored after it. That is safe because
// no file the agent itself creates depends on the mask: it sets every mode exactly (see
// mkdirAll and WriteFile).
func startWithUmask(umask int, argv0 string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
	umaskMu.Lock()
	defer umaskMu.Unlock()
	old := unix.Umask(umask)
	defer unix.Umask(old)
	return os.StartProcess(argv0, argv, attr)
}

// startWorkload starts a workload's process (startWithUmask) from a thread of its own, locked
// to this goroutine for the fork: with Config.WorkloadCapabilities, that thread's bounding
// set is limited first, which the child inherits; with Config.WorkloadTasks (cgroup v1), the
// thread moves into the workloads' cgroup for the fork, which the child inherits too, and
// back after it; with Config.WorkloadCgroup (v2), the child is cloned into that cgroup. A thread that cannot move back is never given back to the Go scheduler: locked
// to this goroutine, the request's, to its end, it exits with it, so that no other work of
// the agent runs in the workloads' cgroup.
func (a *agent) startWorkload(umask int, argv0 string, argv []string, attr *os.ProcAttr) (*os.Process, error) {
	if a.cfg.WorkloadCgroup != nil {
		if attr.Sys == nil {
			attr.Sys = &syscall.SysProcAttr{}
		}
		attr.Sys.UseCgroupFD = true
		attr.Sys.CgroupFD = int(a.cfg.WorkloadCgroup.Fd())
	}
	moves := a.cfg.WorkloadTasks != nil && a.cfg.AgentTasks != nil
	if !moves && a.cfg.WorkloadCapabilities == nil {
		return startWithUmask(umask, argv0, argv, attr)
	}
	goruntime.LockOSThread()
	if a.cfg.WorkloadCapabilities != nil {
		// Only ever lowers what the thread may pass on; it stays so when given back.
		if err := platform.BoundThreadCapabilities(a.cfg.WorkloadCapabilities); err != nil {
			goruntime.UnlockOSThread()
			return nil, err
		}
	}
	if !moves {
		defer goruntime.UnlockOSThread()
		return startWithUmask(umask, argv0, argv, attr)
	}
	if err := platform.MoveThreadTo(a.cfg.WorkloadTasks); err != nil {
		goruntime.UnlockOSThread() // a write that failed moved nothing
		return nil, err
	}
	p, err := startWithUmask(umask, argv0, argv, attr)
	if berr := platform.MoveThreadTo(a.cfg.AgentTasks); berr != nil {
		a.log.Error("a thread of the agent stays in the workloads' cgroup; it ends with its request", "err", berr)
		return p, err
	}
	goruntime.UnlockOSThread()
	return p, err
}

// workload holds one exec's process and the agent's ends of its stdio.
type workload struct {
	a   *agent
	tty bool
	pid int

	// Our ends: the pty master with a tty, else the pipes.
	master                *os.File
	stdinW, stdoutR, errR *os.File
	// The child's ends, closed in the agent once the child has them.
	child []*os.File

	exited atomic.Bool
}

// UsesStdoutPipes implements control.StdoutPipeUser: Exec gives a passed stdout pipe to the
// workload.
func (a *agent) UsesStdoutPipes() {}

// setupIO makes the workload's stdio: a terminal, or pipes (stdoutPipe, passed by bothyd,
// in place of one of ours when not nil).
func (w *workload) setupIO(req *control.ExecRequest, stdoutPipe *os.File, attr *syscall.SysProcAttr) ([]*os.File, error) {
	if w.tty {
		master, slave, err := openPTY()
		if err != nil {
			return nil, fmt.Errorf("opening a pty: %w", err)
		}
		w.master = master
		w.child = append(w.child, slave)
		rows, cols := req.Rows, req.Cols
		if rows == 0 {
			rows = defaultRows
		}
		if cols == 0 {
			cols = defaultCols
		}
		_ = setWinsize(master, rows, cols) // a size the terminal refuses leaves its default
		// A session of its own with the pty as its controlling terminal (fd 0 in the child),
		// as a login shell has: job control, ^C and SIGHUP on hang-up work as on a terminal.
		attr.Setsid = true
		attr.Setctty = true
		attr.Ctty = 0
		return []*os.File{slave, slave, slave}, nil
	}
	// Its own process group, so that signals, the timeout and the client-gone kill reach
	// what the workload forks as well.
	attr.Setpgid = true
	var stdin *os.File
	if req.Stdin {
		r, wr, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		w.stdinW, stdin = wr, r
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		stdin = f
	}
	w.child = append(w.child, stdin)
	outW := stdoutPipe
	if outW == nil {
		outR, ourW, err := os.Pipe()
		if err != nil {
			w.closeAll()
			return nil, err
		}
		w.stdoutR, outW = outR, ourW
		platform.GrowPipe(outR, control.OutputPipeSize)
	}
	w.child = append(w.child, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		w.closeAll()
		return nil, err
	}
	w.errR = errR
	w.child = append(w.child, errW)
	platform.GrowPipe(errR, control.OutputPipeSize)
	return []*os.File{stdin, outW, errW}, nil
}

func (w *workload) closeChildEnds() {
	for _, f := range w.child {
		f.Close()
	}
	w.child = nil
}

func (w *workload) closeAll() {
	w.closeChildEnds()
	for _, f := range []*os.File{w.master, w.stdinW, w.stdoutR, w.errR} {
		if f != nil {
			f.Close()
		}
	}
}

// startPumps copies the output to the stream and the client's stdin to the workload. The
// output pumps block while the client does not read (the stream's window is full), and the
// workload then blocks on its full pipe: memory stays bounded whatever it prints.
func (w *workload) startPumps(s *control.ExecStream) *sync.WaitGroup {
	var wg sync.WaitGroup
	pump := func(dst io.Writer, src *os.File) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(dst, &drainReader{f: src, exited: &w.exited})
		}()
	}
	stdin := s.Stdin()
	if w.tty {
		pump(s.Stdout(), w.master)
		if stdin != nil {
			// A resize takes effect between the keystrokes sent before and after it.
			s.OnResize(w.resize)
			go func() {
				io.Copy(w.master, stdin)
				// The client's end of input: on a terminal that is the EOF character (^D at
				// the start of a line), as a user would type it.
				if !w.exited.Load() {
					_, _ = w.master.Write([]byte{4})
				}
			}()
		}
		return &wg
	}
	if w.stdoutR != nil {
		pump(s.Stdout(), w.stdoutR)
	}
	pump(s.Stderr(), w.errR)
	if stdin != nil {
		go func() {
			io.Copy(w.stdinW, stdin)
			w.stdinW.Close()
		}()
	}
	return &wg
}

// armDrain, called once the workload exited, makes the output pumps give up on pipes that
// stay silent for control.OutputDrainIdle.
func (w *workload) armDrain() {
	for _, f := range []*os.File{w.master, w.stdoutR, w.errR} {
		if f != nil {
			f.SetReadDeadline(time.Now().Add(control.OutputDrainIdle))
		}
	}
}

// drainReader re-arms the idle deadline before every read once the workload exited, so a
// pump stops only when the pipe stayed silent for control.OutputDrainIdle, not while output
// still flows.
// A pty master reports EIO once every holder of the terminal closed it: that is its EOF.
type drainReader struct {
	f      *os.File
	exited *atomic.Bool
}

func (d *drainReader) Read(p []byte) (int, error) {
	if d.exited.Load() {
		d.f.SetReadDeadline(time.Now().Add(control.OutputDrainIdle))
	}
	n, err := d.f.Read(p)
	if err != nil && (errors.Is(err, unix.EIO) || errors.Is(err, os.ErrDeadlineExceeded)) {
		err = io.EOF
	}
	return n, err
}

// kill ends the workload with SIGKILL: its process group, and with a tty every process of its
// session (a shell with job control puts jobs into groups of their own).
func (w *workload) kill() {
	unix.Kill(-w.pid, unix.SIGKILL)
	if w.tty {
		for _, p := range processes() {
			if p.sid == w.pid {
				unix.Kill(p.pid, unix.SIGKILL)
			}
		}
	}
}

func (w *workload) signal(name string) {
	sig := unix.SignalNum("SIG" + strings.TrimPrefix(name, "SIG"))
	if sig == 0 {
		w.a.log.Info("exec: ignoring an unknown signal", "signal", name)
		return
	}
	unix.Kill(-w.pid, sig)
}

func (w *workload) resize(ws control.WindowSize) {
	if w.master != nil && ws.Rows > 0 && ws.Cols > 0 {
		_ = setWinsize(w.master, ws.Rows, ws.Cols)
	}
}

// env builds the workload's environment: built-in defaults, then the agent's, then the
// request's; a later entry replaces an earlier one of the same name.
func (a *agent) env(name string, u UserSpec, req *control.ExecRequest) []string {
	env := []string{"PATH=" + defaultPath, "HOME=" + u.Home, "USER=" + name, "LOGNAME=" + name}
	if req.TTY {
		env = append(env, "TERM="+defaultTerm)
	}
	env = append(env, a.cfg.DefaultEnv...)
	env = append(env, req.Env...)
	seen := map[string]int{}
	out := env[:0:0]
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		if i, ok := seen[k]; ok {
			out[i] = e
			continue
		}
		seen[k] = len(out)
		out = append(out, e)
	}
	return out
}

func envValue(env []string, key string) string {
	for _, e := range env {
		if k, v, _ := strings.Cut(e, "="); k == key {
			return v
		}
	}
	return ""
}

// checkCwd refuses a working directory the workload could not start in, with the code of
// why: it does not exist (file-not-found), it is not a directory (not-a-directory), or the
// user may not search it (permission-denied). The check is made as the user, since the
// child's chdir is; its failure would otherwise be told apart from the execve's by nothing.
func (a *agent) checkCwd(user, dir string) error {
	err := a.asUser(user, func() error {
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return unix.ENOTDIR
		}
		return unix.Faccessat(unix.AT_FDCWD, dir, unix.X_OK, unix.AT_EACCESS)
	})
	if err == nil {
		return nil
	}
	d := truncate(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &control.RemoteError{Code: control.CodeFileNotFound,
			Message: fmt.Sprintf("The working directory %q does not exist inside the sandbox; create it first, or run the command elsewhere.", d)}
	case errors.Is(err, unix.ENOTDIR):
		return &control.RemoteError{Code: control.CodeNotADirectory,
			Message: fmt.Sprintf("The working directory %q is not a directory inside the sandbox.", d)}
	case errors.Is(err, fs.ErrPermission):
		return &control.RemoteError{Code: control.CodePermissionDenied,
			Message: fmt.Sprintf("The user may not enter the working directory %q; run the command elsewhere, or as a user who may.", d)}
	}
	return fileError(err, dir)
}

// lookPath finds a command the way a shell would with the workload's PATH (not the agent's).
// A name with a slash is used as it is, relative to the workload's directory.
func lookPath(file, path, dir string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &control.RemoteError{Code: control.CodeCommandNotFound,
		Message: fmt.Sprintf("Command %q was not found in PATH inside the sandbox.", truncate(file))}
}

// startError explains a failed start. os.StartProcess reports the child's failed chdir and
// execve alike, so the working directory was checked before.
func startError(err error, cmd string) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &control.RemoteError{Code: control.CodeCommandNotFound,
			Message: fmt.Sprintf("Command %q was not found inside the sandbox.", truncate(cmd))}
	case errors.Is(err, fs.ErrPermission):
		return &control.RemoteError{Code: control.CodeNotExecutable,
			Message: fmt.Sprintf("Command %q may not be executed by this user.", truncate(cmd))}
	case errors.Is(err, unix.ENOEXEC):
		return &control.RemoteError{Code: control.CodeNotExecutable,
			Message: fmt.Sprintf("Command %q is not an executable this sandbox can run.", truncate(cmd))}
	case errors.Is(err, unix.EAGAIN):
		return &control.RemoteError{Code: control.CodePidsLimit,
			Message: fmt.Sprintf("Command %q cannot start: the sandbox's processes are at its pids limit. Retry once some of them end (signal or stop them), or recreate the sandbox with a higher resources.pids.", truncate(cmd))}
	}
	return err
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
