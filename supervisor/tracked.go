package supervisor

import (
	"context"
	"errors"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
)

// Tracked processes are the E2B surface's process model (docs/e2b.md): the sandbox's agent
// holds them (control.FeatureProcs), not bothyd, so they outlive the call that started
// them, every client's connection and a restart of bothyd. Like [Supervisor.StartProcess]
// they take no exec lock.

// TrackedInput is input for a tracked process: stdin bytes, then (EOF) the end of stdin, a
// signal name, a terminal size; any of them.
type TrackedInput struct {
	Stdin      []byte
	EOF        bool
	Signal     string
	Rows, Cols uint16
}

// TrackedInfo describes a running tracked process.
type TrackedInfo struct {
	PID    int
	Tag    string
	Argv   []string
	Cwd    string
	Client []byte // what the caller gave at its start
}

// Attachment is a stream attached to a tracked process: its output and, at its end, its exit
// status. Close detaches, and leaves the process running.
type Attachment struct {
	a    *Admission
	proc *control.Process
}

// ErrNoProcess is the error (wrapped) of an attachment or input that finds no running tracked
// process of that pid or tag.
var ErrNoProcess = errors.New("no such process")

// StartTracked starts a tracked process in a running sandbox, with the image's defaults as
// exec applies them, and attaches to it from its start. stdin says whether it reads stdin;
// tag and client are kept with it for [Supervisor.ListTracked]. ctx bounds the start only.
func (s *Supervisor) StartTracked(ctx context.Context, id string, req ExecRequest, stdin bool, tag string, client []byte) (*Attachment, error) {
	a, err := s.trackedAdmission(ctx, id)
	if err != nil {
		return nil, err
	}
	creq := a.defaults.apply(req).control(stdin)
	proc, err := a.agent.StartTracked(ctx, control.ProcRequest{Exec: &creq, Tag: tag, Client: client})
	if err != nil {
		return nil, lost(a, err)
	}
	return &Attachment{a: a, proc: proc}, nil
}

// AttachTracked attaches to a running tracked process by pid, or with pid 0 by tag; with
// replay, the latest output the agent holds comes first.
func (s *Supervisor) AttachTracked(ctx context.Context, id string, pid int, tag string, replay bool) (*Attachment, error) {
	a, err := s.trackedAdmission(ctx, id)
	if err != nil {
		return nil, err
	}
	proc, err := a.agent.AttachTracked(ctx, pid, tag, replay)
	if err != nil {
		return nil, trackedErr(a, err)
	}
	return &Attachment{a: a, proc: proc}, nil
}

// ListTracked lists a sandbox's running tracked processes.
func (s *Supervisor) ListTracked(ctx context.Context, id string) ([]TrackedInfo, error) {
	a, err := s.trackedAdmission(ctx, id)
	if err != nil {
		return nil, err
	}
	l, err := a.agent.ListTracked(ctx)
	if err != nil {
		return nil, lost(a, err)
	}
	out := make([]TrackedInfo, 0, len(l.Processes))
	for _, p := range l.Processes {
		out = append(out, TrackedInfo{PID: p.PID, Tag: p.Tag, Argv: p.Argv, Cwd: p.Cwd, Client: p.Client})
	}
	return out, nil
}

// InputTracked gives input to a running tracked process, selected by pid or (pid 0) by tag.
func (s *Supervisor) InputTracked(ctx context.Context, id string, pid int, tag string, in TrackedInput) error {
	a, err := s.trackedAdmission(ctx, id)
	if err != nil {
		return err
	}
	req := control.ProcRequest{PID: pid, Tag: tag, Stdin: in.Stdin, EOF: in.EOF, Signal: in.Signal}
	if in.Rows > 0 && in.Cols > 0 {
		req.Resize = &control.WindowSize{Rows: in.Rows, Cols: in.Cols}
	}
	if err := a.agent.InputTracked(ctx, req); err != nil {
		return trackedErr(a, err)
	}
	return nil
}

// trackedAdmission is the running sandbox's agent, without a lock (as StartProcess's).
func (s *Supervisor) trackedAdmission(ctx context.Context, id string) (*Admission, error) {
	st, err := s.Status(id)
	if err != nil {
		return nil, err
	}
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	return &Admission{id: id, agent: agent, defaults: s.execDefaultsOf(st.Config.Image)}, nil
}

// trackedErr explains the agent's answer that no such process runs.
func trackedErr(a *Admission, err error) error {
	var re *control.RemoteError
	if errors.As(err, &re) && re.Code == control.CodeProcessNotFound {
		return errcode.Wrap(errcode.NotFound, ErrNoProcess, "%s", re.Message)
	}
	return lost(a, err)
}

// PID is the process's pid inside the sandbox.
func (x *Attachment) PID() int { return x.proc.PID }

// ReadOutput reads the next piece of output into p, and says whose it is. At the process's
// end it returns io.EOF and Wait has the status; on any other error the attachment is over.
func (x *Attachment) ReadOutput(p []byte) (Stream, int, error) {
	t, n, err := x.proc.ReadOutput(p)
	stream := Stdout
	if t == control.FrameStderr {
		stream = Stderr
	}
	return stream, n, err
}

// Wait returns how the process ended, once its output was read to the end.
func (x *Attachment) Wait() (ExitStatus, error) {
	st, err := x.proc.Wait()
	if err != nil {
		return ExitStatus{}, lost(x.a, err)
	}
	return exitStatus(st), nil
}

// Close detaches; the process runs on. It is idempotent.
func (x *Attachment) Close() error { return x.proc.Close() }
