package supervisor

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
)

// MaxExecOutput caps each of a buffered exec's stdout and stderr ([Supervisor.RunExec]); the
// rest is read and discarded, and the result says it was cut. A [Session] has no cap: its
// reader relays the output as it comes.
const MaxExecOutput = 1 << 20

// ExecRequest is a workload to run in a sandbox.
type ExecRequest struct {
	Argv []string
	// Env entries are K=V; they override the agent's defaults of the same name.
	Env []string
	// Cwd is an absolute path; "" means the user's home.
	Cwd string
	// User is a user name or uid; "" means the sandbox's unprivileged user.
	User string
	// TTY runs the workload on a terminal of Rows by Cols (the agent's default, 24x80, for 0).
	TTY        bool
	Rows, Cols uint16
	// Timeout, when positive, kills the workload that long after it started.
	Timeout time.Duration
	// Umask is the workload's file mode creation mask (0 to 0777); nil is the agent's
	// default, [control.DefaultUmask].
	Umask *uint32
}

// control is the request on the wire; stdin says the caller will send stdin.
func (r ExecRequest) control(stdin bool) control.ExecRequest {
	return control.ExecRequest{
		Argv: r.Argv, Env: r.Env, Cwd: r.Cwd, User: r.User,
		TTY: r.TTY, Rows: r.Rows, Cols: r.Cols,
		TimeoutMS: r.Timeout.Milliseconds(),
		Stdin:     stdin,
		Umask:     r.Umask,
	}
}

// ExitStatus is how a workload ended.
type ExitStatus struct {
	// ExitCode is the exit code, or 128+signal number when a signal ended the workload, as a
	// shell reports it.
	ExitCode int
	// Signal is the name of the signal that ended it, without the SIG prefix ("TERM"), if any.
	Signal string
	// TimedOut says its timeout passed and it was killed.
	TimedOut bool
	// OOM says the kernel's out-of-memory killer ended it (best effort).
	OOM bool
}

func exitStatus(st control.ExitStatus) ExitStatus {
	return ExitStatus{ExitCode: st.ExitCode, Signal: st.Signal, TimedOut: st.TimedOut, OOM: st.OOM}
}

// ExecResult is a buffered exec's outcome: its status and the first [MaxExecOutput] bytes of
// each output stream.
type ExecResult struct {
	ExitStatus
	Stdout, Stderr                   string
	StdoutTruncated, StderrTruncated bool
}

// RunExec runs an admitted workload to its end, feeding it stdin (nil for none) and
// collecting its output. The workload belongs to ctx: when ctx ends first, nobody can read
// the result, so the workload is killed (closing its control stream makes the agent kill it).
func (s *Supervisor) RunExec(ctx context.Context, a *Admission, req ExecRequest, stdin io.Reader) (*ExecResult, error) {
	req = a.defaults.apply(req)
	proc, err := a.agent.Exec(ctx, req.control(stdin != nil))
	if msg, code, ok := commandRefused(err); ok {
		// As a shell answers it: exit 127 or 126, and why on stderr.
		return &ExecResult{ExitStatus: ExitStatus{ExitCode: code}, Stderr: "bothyd: " + msg + "\n"}, nil
	}
	if err != nil {
		return nil, lost(a, err)
	}
	defer proc.Close()
	stop := context.AfterFunc(ctx, func() { proc.Close() })
	defer stop()

	if proc.Stdin != nil {
		go func() {
			_, _ = io.Copy(proc.Stdin, stdin)
			proc.Stdin.Close()
		}()
	}
	overdue := endOverdue(a, req.Timeout, proc)
	var stdout, stderr cappedBuffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(&stdout, proc.Stdout) }()
	go func() { defer wg.Done(); _, _ = io.Copy(&stderr, proc.Stderr) }()
	wg.Wait()
	status, err := proc.Wait()
	if overdue() {
		return nil, errcode.New(errcode.SandboxPaused,
			"Sandbox %s was paused while the command ran, past the command's timeout (%s); the command is killed when the sandbox resumes, and its output is lost.", a.id, req.Timeout)
	}
	if err != nil {
		return nil, lost(a, err)
	}
	return &ExecResult{
		ExitStatus:      exitStatus(status),
		Stdout:          stdout.String(),
		Stderr:          stderr.String(),
		StdoutTruncated: stdout.truncated,
		StderrTruncated: stderr.truncated,
	}, nil
}

// execOverdueGrace is how long past its timeout a command may run before the server ends its
// exec, when the agent that should have ended it is frozen.
const execOverdueGrace = 5 * time.Second

// endOverdue ends proc, an exec with timeout, once it runs past the timeout and a grace while
// its agent is frozen (its sandbox paused): the agent ends a command at its timeout, but a
// frozen one cannot, and an exec of a sandbox paused for good would otherwise wait for the
// resume however long. The returned func, called once the exec is over, reports whether it
// ended it.
func endOverdue(a *Admission, timeout time.Duration, proc *control.Process) (ended func() bool) {
	if timeout <= 0 {
		return func() bool { return false }
	}
	var overdue atomic.Bool
	done := make(chan struct{})
	go func() {
		t := time.NewTimer(timeout + execOverdueGrace)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if a.agent.Frozen() {
				overdue.Store(true)
				proc.Close()
				return
			}
			t.Reset(time.Second) // a live agent ends it, and the keepalive finds a dead one
		}
	}()
	return func() bool {
		close(done)
		return overdue.Load()
	}
}

// cappedBuffer keeps the first MaxExecOutput bytes written to it and discards the rest, so
// that a workload flooding its output cannot exhaust the server's memory, and is still read to
// the end so that it is not stalled.
type cappedBuffer struct {
	strings.Builder
	truncated bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := MaxExecOutput - c.Len(); room < len(p) {
		c.truncated = true
		if room > 0 {
			c.Builder.Write(p[:room])
		}
		return len(p), nil
	}
	return c.Builder.Write(p)
}

// Stream names a workload's output stream.
type Stream int

// The output streams of a [Session]; with TTY all output is Stdout.
const (
	Stdout Stream = iota + 1
	Stderr
)

// Session is a workload started with [Supervisor.StartExec], whose input and output its
// caller relays: stdin in, output in the order the agent sent it, resizes and signals. Its
// methods but Close must not be called concurrently with themselves; Close may be called at
// any time, from any goroutine.
type Session struct {
	a    *Admission
	proc *control.Process
	// missing, for a command that does not exist or cannot be executed (proc nil), is what
	// the session reads out before its exit missingCode (127 or 126): why, on stderr (stdout
	// with a TTY), as a shell answers it.
	missing       []byte
	missingCode   int
	missingStream Stream
}

// StartExec starts an admitted workload with its stdin open, for its caller to relay. The
// workload runs until it exits, its timeout passes, or Close kills it; ctx bounds only the
// start.
func (s *Supervisor) StartExec(ctx context.Context, a *Admission, req ExecRequest) (*Session, error) {
	// A relayed workload may flood its output: stdout bypasses the agent where it can.
	proc, err := a.agent.ExecPiped(ctx, a.defaults.apply(req).control(true))
	if msg, code, ok := commandRefused(err); ok {
		// As the buffered exec answers it: a session that says why and exits 127 or 126.
		x := &Session{a: a, missing: []byte("bothyd: " + msg + "\n"), missingCode: code, missingStream: Stderr}
		if req.TTY {
			x.missingStream = Stdout
		}
		return x, nil
	}
	if err != nil {
		return nil, lost(a, err)
	}
	return &Session{a: a, proc: proc}, nil
}

// WriteStdin writes p to the workload's stdin.
func (x *Session) WriteStdin(p []byte) error {
	if x.proc == nil {
		return nil // no command reads it
	}
	_, err := x.proc.Stdin.Write(p)
	return err
}

// CloseStdin sends end-of-file to the workload's stdin.
func (x *Session) CloseStdin() error {
	if x.proc == nil {
		return nil
	}
	return x.proc.Stdin.Close()
}

// Resize changes the workload's terminal size (TTY only).
func (x *Session) Resize(rows, cols uint16) error {
	if x.proc == nil {
		return nil
	}
	return x.proc.Resize(rows, cols)
}

// Signal sends the named signal ("SIGINT" or "INT") to the workload.
func (x *Session) Signal(name string) error {
	if x.proc == nil {
		return nil
	}
	return x.proc.Signal(name)
}

// ReadOutput reads the next piece of the workload's output into p, and says whose it is. At
// the workload's end it returns io.EOF, and Wait has the status; on any other error the
// workload is over as well.
func (x *Session) ReadOutput(p []byte) (Stream, int, error) {
	if x.proc == nil {
		if len(x.missing) == 0 {
			return x.missingStream, 0, io.EOF
		}
		n := copy(p, x.missing)
		x.missing = x.missing[n:]
		return x.missingStream, n, nil
	}
	t, n, err := x.proc.ReadOutput(p)
	stream := Stdout
	if t == control.FrameStderr {
		stream = Stderr
	}
	return stream, n, err
}

// Wait returns how the workload ended, once its output was read to the end. A workload whose
// sandbox stopped under it ends without a status, with not-running.
func (x *Session) Wait() (ExitStatus, error) {
	if x.proc == nil {
		return ExitStatus{ExitCode: x.missingCode}, nil
	}
	st, err := x.proc.Wait()
	if err != nil {
		return ExitStatus{}, lost(x.a, err)
	}
	return exitStatus(st), nil
}

// Close kills the workload if it still runs, and ends the session. It is idempotent.
func (x *Session) Close() error {
	if x.proc == nil {
		return nil
	}
	return x.proc.Close()
}

// commandRefused reports the agent's answer that the command does not exist (exit status
// 127, as a shell answers it) or cannot be executed by the user (126), with its message.
// The request was valid: what refused it is the sandbox's files, and a shell's script reads
// the status.
func commandRefused(err error) (msg string, exitCode int, ok bool) {
	var re *control.RemoteError
	if !errors.As(err, &re) {
		return "", 0, false
	}
	switch re.Code {
	case control.CodeCommandNotFound:
		return re.Message, 127, true
	case control.CodeNotExecutable:
		return re.Message, 126, true
	}
	return "", 0, false
}

// lost explains a workload that ended without an exit status. When its control session is
// gone, the sandbox stopped (or its agent died) under it: that is the caller's answer, not a
// server fault.
func lost(a *Admission, err error) error {
	select {
	case <-a.agent.Done():
		return errcode.Wrap(errcode.NotRunning, err,
			"Sandbox %s stopped while the command ran, and the command ended with it; its output is lost.", a.id)
	default:
		return err
	}
}
