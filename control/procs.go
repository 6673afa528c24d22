package control

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// FeatureProcs is announced by an agent whose Handler is also a [ProcessTracker]: it serves
// the tracked-process operations. They are the E2B surface's process model (docs/e2b.md):
// unlike exec, a tracked process belongs to the agent, not to the stream that started it, so
// it outlives its client, the client's connection and a restart of bothyd, and any number
// of streams may attach to it at once.
const FeatureProcs = "procs"

// The tracked-process operations (feature "procs"). Each header carries a [ProcRequest].
//
//   - proc-start ({exec, tag, client}): the agent starts the workload and answers started
//     {pid} (or error), then the workload's output from its start, as exec does (stdout and
//     stderr frames), and last exit ([ExitStatus]). The stream is also an attachment: its
//     close by the client detaches it and leaves the process running.
//   - proc-attach ({pid} or {tag}; replay): started {pid}, then the output (with replay, what
//     the agent still holds of it first: see [ProcReplayBytes]), then exit. An error
//     process-not-found when no running process has that pid or tag. Closing detaches.
//   - proc-list: a result [ProcList] of the running tracked processes.
//   - proc-input ({pid} or {tag}; stdin, eof, signal, resize): one result {} once the agent
//     took the input (stdin waits while the workload's stdin queue is full).
//
// On every one of them the client sends nothing after the header.
const (
	OpProcStart  Op = "proc-start"
	OpProcAttach Op = "proc-attach"
	OpProcList   Op = "proc-list"
	OpProcInput  Op = "proc-input"
)

// CodeProcessNotFound answers an attach or an input that selects no running tracked process.
const CodeProcessNotFound = "process-not-found"

// Bounds of the tracked processes.
const (
	// MaxTrackedProcs bounds how many tracked processes run at once in one sandbox.
	MaxTrackedProcs = 1024
	// ProcReplayBytes is how much of a tracked process's latest output the agent holds for
	// attachments to come. While a stream is attached, the process is not let further ahead
	// of it than that: an attached stream that does not read stalls the process (flow
	// control) instead of losing output; with none attached, older output is dropped.
	ProcReplayBytes = 256 << 10
	// MaxProcInput bounds the stdin bytes of one proc-input.
	MaxProcInput = 256 << 10
	// MaxProcClientData bounds the client's data stored with a process.
	MaxProcClientData = 8 << 10
	maxProcTag        = 256
)

// ProcRequest is the request of the tracked-process operations; the op says which fields
// count.
type ProcRequest struct {
	// Exec is the workload of proc-start.
	Exec *ExecRequest `json:"exec,omitempty"`
	// Tag names the process at proc-start; it selects a process in attach and input when PID
	// is 0.
	Tag string `json:"tag,omitempty"`
	// Client is data of the client's own, kept with the process and returned by proc-list
	// (bothyd keeps E2B's process config there).
	Client []byte `json:"client,omitempty"`
	// PID selects the process of attach and input.
	PID int `json:"pid,omitempty"`
	// Replay asks an attach for the output the agent holds before the live output.
	Replay bool `json:"replay,omitempty"`
	// The input of proc-input: stdin bytes, then (with EOF) the end of stdin, a signal name
	// ("TERM", "KILL"), a terminal size; any of them, in this order.
	Stdin  []byte      `json:"stdin,omitempty"`
	EOF    bool        `json:"eof,omitempty"`
	Signal string      `json:"signal,omitempty"`
	Resize *WindowSize `json:"resize,omitempty"`
}

func validateProcHeader(h *Header) error {
	r := h.Proc
	if r == nil && h.Op == OpProcList {
		return nil
	}
	if r == nil {
		return invalidf("A %s header needs a proc request.", h.Op)
	}
	if len(r.Tag) > maxProcTag {
		return invalidf("The process tag is longer than %d bytes.", maxProcTag)
	}
	switch h.Op {
	case OpProcStart:
		if r.Exec == nil {
			return invalidf("A %s header needs an exec request.", h.Op)
		}
		if len(r.Client) > MaxProcClientData {
			return invalidf("The client data of a process is more than %d bytes.", MaxProcClientData)
		}
		return r.Exec.Validate()
	case OpProcAttach, OpProcInput:
		if r.PID <= 0 && r.Tag == "" {
			return invalidf("Select the process by its pid or its tag.")
		}
		if len(r.Stdin) > MaxProcInput {
			return invalidf("The input is more than %d bytes; send it in pieces.", MaxProcInput)
		}
		if len(r.Signal) > 16 {
			return invalidf("Unknown signal %q.", truncate(r.Signal))
		}
	}
	return nil
}

// ProcInfo describes a running tracked process.
type ProcInfo struct {
	PID  int      `json:"pid"`
	Tag  string   `json:"tag,omitempty"`
	Argv []string `json:"argv"`
	Cwd  string   `json:"cwd,omitempty"`
	// Client is the client's data given at its start.
	Client []byte `json:"client,omitempty"`
}

// ProcList is proc-list's answer. An agent lists no more than fits one frame: Truncated says
// it left processes out.
type ProcList struct {
	Processes []ProcInfo `json:"processes"`
	Truncated bool       `json:"truncated,omitempty"`
}

// ProcessTracker is what a [Handler] implements to serve the tracked processes. Start and
// Attach call s.Started with the pid, stream the output through s, and return the exit status
// once the process ended and its output was sent; when ctx ends (the client detached or its
// connection ended) they return at once, and the process runs on. Errors that are
// [*RemoteError] are sent as they are.
type ProcessTracker interface {
	StartTracked(ctx context.Context, req *ProcRequest, s *AttachStream) (ExitStatus, error)
	AttachTracked(ctx context.Context, req *ProcRequest, s *AttachStream) (ExitStatus, error)
	ListTracked(ctx context.Context) (ProcList, error)
	InputTracked(ctx context.Context, req *ProcRequest) error
}

// AttachStream is the agent's side of one attachment to a tracked process.
type AttachStream struct {
	fw *frameWriter
}

// Started tells the client the pid; call it once, before any output.
func (s *AttachStream) Started(pid int) error {
	return writeJSON(s.fw, FrameStarted, Started{PID: pid})
}

// Output sends a piece of output: t is FrameStdout or FrameStderr. It blocks while the
// client does not read.
func (s *AttachStream) Output(t FrameType, p []byte) error {
	if t != FrameStdout && t != FrameStderr {
		return fmt.Errorf("control: %s is not output", t)
	}
	sw := frameStreamWriter{fw: s.fw, typ: t, chunk: outputChunkSize}
	_, err := sw.Write(p)
	return err
}

func (s *server) serveProc(ctx context.Context, st *yamux.Stream, fw *frameWriter, hdr *Header) {
	t, ok := s.h.(ProcessTracker)
	if !ok {
		writeError(fw, invalidf("This agent does not serve %s.", hdr.Op))
		return
	}
	ctx, stop := watchClient(ctx, st)
	defer stop()
	// A detached client reads nothing more: a write blocked on it must fail, not wait.
	unhook := context.AfterFunc(ctx, func() { st.SetWriteDeadline(time.Now()) })
	defer unhook()
	req := hdr.Proc
	switch hdr.Op {
	case OpProcStart, OpProcAttach:
		as := &AttachStream{fw: fw}
		run := t.AttachTracked
		if hdr.Op == OpProcStart {
			run = t.StartTracked
		}
		status, err := run(ctx, req, as)
		if ctx.Err() != nil {
			return // detached: nobody to tell
		}
		if err != nil {
			writeError(fw, err)
			return
		}
		_ = writeJSON(fw, FrameExit, status)
	case OpProcList:
		l, err := t.ListTracked(ctx)
		if err != nil {
			writeError(fw, err)
			return
		}
		_ = writeJSON(fw, FrameResult, l)
	case OpProcInput:
		if err := t.InputTracked(ctx, req); err != nil {
			writeError(fw, err)
			return
		}
		_ = writeJSON(fw, FrameResult, struct{}{})
	}
}

// LocalExec runs a [Handler]'s Exec without a stream: it hands the handler an [ExecStream]
// whose frames go to a function of the agent's, and takes stdin, resizes and signals from
// the agent's own calls. The agent's tracked processes run through it, so that they are
// exec's workloads in every respect but who holds them.
type LocalExec struct {
	es          *ExecStream
	done        chan struct{}
	finish      sync.Once
	mu          sync.Mutex // orders stdin, its end and the resizes among them
	stdinClosed bool
}

// NewLocalExec makes the stream for one workload. out receives its started frame (a JSON
// [Started]) and its stdout and stderr frames, one call a frame, from the handler's
// goroutines, one at a time; the payload is valid only during the call. A blocked out blocks
// the workload's output. stdin says the workload reads stdin (as [ExecRequest.Stdin]).
func NewLocalExec(stdin bool, out func(t FrameType, payload []byte) error) *LocalExec {
	fw := &frameWriter{w: frameSink(out)}
	l := &LocalExec{
		done: make(chan struct{}),
		es: &ExecStream{
			fw:      fw,
			stdout:  frameStreamWriter{fw: fw, typ: FrameStdout, chunk: outputChunkSize},
			stderr:  frameStreamWriter{fw: fw, typ: FrameStderr, chunk: outputChunkSize},
			resize:  make(chan WindowSize, 1),
			signals: make(chan string, 16),
		},
	}
	if stdin {
		l.es.stdin = &stdinReader{ch: make(chan stdinItem, stdinQueueLen), done: l.done, resize: l.es.resize}
	}
	return l
}

// frameSink hands each whole frame written to it to a function: a frameWriter writes a frame
// with one Write.
type frameSink func(FrameType, []byte) error

func (f frameSink) Write(b []byte) (int, error) {
	if len(b) < frameHeaderSize {
		return 0, io.ErrShortWrite
	}
	if err := f(FrameType(b[0]), b[frameHeaderSize:]); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Stream is what to hand to the handler's Exec.
func (l *LocalExec) Stream() *ExecStream { return l.es }

// Finish is called once Exec returned: pending input calls give up.
func (l *LocalExec) Finish() { l.finish.Do(func() { close(l.done) }) }

var errExecOver = &RemoteError{Code: CodeInvalidRequest, Message: "The process has ended."}

// Stdin queues p for the workload's stdin, waiting while the queue is full.
func (l *LocalExec) Stdin(ctx context.Context, p []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.es.stdin == nil || l.stdinClosed {
		return &RemoteError{Code: CodeInvalidRequest, Message: "The process's stdin is closed."}
	}
	for len(p) > 0 {
		n := min(len(p), chunkSize)
		item := stdinItem{data: append([]byte(nil), p[:n]...)}
		select {
		case l.es.stdin.ch <- item:
		case <-l.done:
			return errExecOver
		case <-ctx.Done():
			return ctx.Err()
		}
		p = p[n:]
	}
	return nil
}

// CloseStdin ends the workload's stdin, after what was queued.
func (l *LocalExec) CloseStdin() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.es.stdin != nil && !l.stdinClosed {
		l.stdinClosed = true
		close(l.es.stdin.ch)
	}
}

// Resize changes the terminal size, in its place among the stdin bytes while stdin is open
// (see [ExecStream.OnResize]).
func (l *LocalExec) Resize(ctx context.Context, ws WindowSize) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.es.stdin != nil && !l.stdinClosed {
		select {
		case l.es.stdin.ch <- stdinItem{size: &ws}:
			return nil
		case <-l.done:
			return errExecOver
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	keepLatest(l.es.resize, ws)
	return nil
}

// Signal sends the named signal to the workload (through the handler, as exec's signal
// frames do).
func (l *LocalExec) Signal(ctx context.Context, name string) error {
	// The channel has room after the end too: the end is checked first.
	select {
	case <-l.done:
		return errExecOver
	default:
	}
	select {
	case l.es.signals <- name:
		return nil
	case <-l.done:
		return errExecOver
	case <-ctx.Done():
		return ctx.Err()
	}
}

// The client's side.

func (c *Client) procsServed() error {
	if !slices.Contains(c.hello.Features, FeatureProcs) {
		return fmt.Errorf("control: the agent (%s) does not serve tracked processes; restart the sandbox with this bothyd", c.hello.AgentVersion)
	}
	return nil
}

// StartTracked starts a tracked process and attaches to it from its start. The returned
// [Process] reads its output and exit like an exec's, but its Close only detaches: the
// process runs on, to be attached to again ([Client.AttachTracked]) and driven with
// [Client.InputTracked]. Its Stdin is nil and its Signal and Resize must not be used. ctx
// bounds the start only.
func (c *Client) StartTracked(ctx context.Context, req ProcRequest) (*Process, error) {
	return c.openTracked(ctx, OpProcStart, req)
}

// AttachTracked attaches to a running tracked process by pid (or, with pid 0, by tag); with
// replay the output the agent still holds comes first. A process that is not running is an
// error whose remote code is [CodeProcessNotFound].
func (c *Client) AttachTracked(ctx context.Context, pid int, tag string, replay bool) (*Process, error) {
	return c.openTracked(ctx, OpProcAttach, ProcRequest{PID: pid, Tag: tag, Replay: replay})
}

func (c *Client) openTracked(ctx context.Context, op Op, req ProcRequest) (*Process, error) {
	if err := c.procsServed(); err != nil {
		return nil, err
	}
	hdr := Header{Op: op, Proc: &req}
	if err := hdr.Validate(); err != nil {
		return nil, asRemote(err).Err()
	}
	st, fw, stop, err := c.open(ctx, hdr)
	if err != nil {
		return nil, err
	}
	t, p, err := ReadFrame(st, nil)
	live := stop()
	if err != nil || !live {
		st.Close()
		if err == nil {
			err = context.Canceled
		}
		return nil, c.streamErr(ctx, err)
	}
	switch t {
	case FrameStarted:
	case FrameError:
		st.Close()
		return nil, decodeRemoteError(p)
	default:
		st.Close()
		return nil, fmt.Errorf("control: unexpected %s frame answering %s", t, op)
	}
	var s Started
	if err := json.Unmarshal(p, &s); err != nil {
		st.Close()
		return nil, fmt.Errorf("control: malformed started frame: %w", err)
	}
	pr := &Process{PID: s.PID, c: c, st: st, fw: fw, done: make(chan struct{})}
	pr.outR, pr.outW = io.Pipe()
	pr.errR, pr.errW = io.Pipe()
	pr.Stdout, pr.Stderr = &pipeOutput{p: pr, r: pr.outR}, &pipeOutput{p: pr, r: pr.errR}
	return pr, nil
}

// ListTracked lists the running tracked processes.
func (c *Client) ListTracked(ctx context.Context) (ProcList, error) {
	if err := c.procsServed(); err != nil {
		return ProcList{}, err
	}
	var l ProcList
	err := c.roundTrip(ctx, Header{Op: OpProcList}, &l)
	return l, err
}

// InputTracked gives a tracked process input (req.PID or req.Tag select it): stdin bytes,
// the end of stdin, a signal, a terminal size. Stdin longer than [MaxProcInput] is sent in
// several operations.
func (c *Client) InputTracked(ctx context.Context, req ProcRequest) error {
	if err := c.procsServed(); err != nil {
		return err
	}
	for len(req.Stdin) > MaxProcInput {
		part := req
		part.Stdin, part.EOF, part.Signal, part.Resize = req.Stdin[:MaxProcInput], false, "", nil
		if err := c.inputOnce(ctx, part); err != nil {
			return err
		}
		req.Stdin = req.Stdin[MaxProcInput:]
	}
	return c.inputOnce(ctx, req)
}

func (c *Client) inputOnce(ctx context.Context, req ProcRequest) error {
	hdr := Header{Op: OpProcInput, Proc: &req}
	if err := hdr.Validate(); err != nil {
		return asRemote(err).Err()
	}
	return c.roundTrip(ctx, hdr, nil)
}
