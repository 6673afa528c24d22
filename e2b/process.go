package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/e2b/envd/process"
	"github.com/bothy/bothy/e2b/envd/process/processconnect"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// maxKeepalive bounds the keepalive interval a client may ask for; outputChunk is the size of
// one data event at most.
const (
	maxKeepalive = 5 * time.Minute
	outputChunk  = 32 << 10
)

// processService implements envd's process service over the agent's tracked processes
// ([Supervisor.StartTracked]): the agent holds each process, its output and its stdin, so
// a restart of bothyd leaves them running and Connect and List find them again.
type processService struct {
	processconnect.UnimplementedProcessHandler
	h *Handler
}

// selector is a process selector as the agent takes it: a pid, or (pid 0) a tag.
func selector(sel *process.ProcessSelector) (int, string, error) {
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if s.Pid == 0 || s.Pid > math.MaxInt32 {
			return 0, "", connect.NewError(connect.CodeNotFound, fmt.Errorf("there is no process with pid %d", s.Pid))
		}
		return int(s.Pid), "", nil
	case *process.ProcessSelector_Tag:
		if s.Tag == "" {
			return 0, "", connect.NewError(connect.CodeInvalidArgument, errors.New("the tag is empty"))
		}
		return 0, s.Tag, nil
	}
	return 0, "", connect.NewError(connect.CodeInvalidArgument, errors.New("select the process by pid or tag"))
}

// startError is a failed Start as a Connect error. A working directory the sandbox's files
// refuse (missing, not a directory, not to be entered) is invalid_argument, as envd answers
// a cwd that does not exist (the SDKs' InvalidArgumentError); bothyd's own API says
// file-not-found, not-a-directory or permission-denied with field cwd.
func startError(err error) error {
	switch errcode.Of(err) {
	case errcode.FileNotFound, errcode.NotADirectory, errcode.PermissionDenied:
		return connect.NewError(connect.CodeInvalidArgument, errors.New(messageOf(err)))
	}
	return connectError(err)
}

// processError is a tracked process's failure as a Connect error: a process that does not
// run is not_found.
func processError(err error) error {
	if errors.Is(err, supervisor.ErrNoProcess) {
		return connect.NewError(connect.CodeNotFound, err)
	}
	return connectError(err)
}

// kept is what the agent keeps with a process for bothyd (control.ProcRequest.Client):
// its E2B config, for List, and whether it runs on a terminal, for Connect.
type kept struct {
	PTY    bool            `json:"pty,omitempty"`
	Config json.RawMessage `json:"config,omitempty"`
}

// keptOf encodes what to keep: the whole config, or without its environment if that is too
// large to keep.
func keptOf(cfg *process.ProcessConfig, pty bool) []byte {
	for _, c := range []*process.ProcessConfig{cfg, {Cmd: cfg.GetCmd(), Args: cfg.GetArgs(), Cwd: cfg.Cwd}, {Cmd: cfg.GetCmd()}} {
		cb, err := protojson.Marshal(c)
		if err != nil {
			continue
		}
		b, err := json.Marshal(kept{PTY: pty, Config: cb})
		if err == nil && len(b) <= control.MaxProcClientData {
			return b
		}
	}
	return nil
}

// attachment is what relay reads of a tracked process: a *supervisor.Attachment.
type attachment interface {
	ReadOutput(p []byte) (supervisor.Stream, int, error)
	Wait() (supervisor.ExitStatus, error)
	Close() error
}

// errDeadline ends a stream whose call ran out of its time (Connect-Timeout-Ms), as envd
// ends it: the SDKs make a TimeoutException (TimeoutError) of deadline_exceeded, and would
// otherwise see a stream that ends without an end event.
var errDeadline = connect.NewError(connect.CodeDeadlineExceeded, errors.New("the call ran out of its time (Connect-Timeout-Ms)"))

// leave is how a stream ends when its call's context does: deadline_exceeded at its
// deadline, nothing when the client left (no one reads the answer).
func leave(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errDeadline
	}
	return nil
}

// relay sends an attachment's events until the process ends (its end event) or the client
// leaves (the attachment is closed; the process runs on), with keepalive events at interval.
// Reading the output waits while the client does not take it: the agent then holds the
// process (see control.ProcReplayBytes), so no output is lost to a slow client. limited says
// that the call's deadline is the process's time limit (Start's): its end at that limit is
// then the call's deadline_exceeded, not an end event, whichever of the two comes first.
func relay(ctx context.Context, att attachment, pty, limited bool, interval time.Duration, send func(*process.ProcessEvent) error) error {
	defer att.Close()
	events := make(chan *process.ProcessEvent)
	timedOut := false
	go func() {
		defer close(events)
		buf := make([]byte, outputChunk)
		for {
			stream, n, err := att.ReadOutput(buf)
			if n > 0 {
				data := slices.Clone(buf[:n])
				ev := &process.ProcessEvent_DataEvent{}
				switch {
				case pty:
					ev.Output = &process.ProcessEvent_DataEvent_Pty{Pty: data}
				case stream == supervisor.Stderr:
					ev.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: data}
				default:
					ev.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: data}
				}
				select {
				case events <- &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: ev}}:
				case <-ctx.Done():
					return
				}
			}
			if err != nil {
				if ctx.Err() == nil {
					st, werr := att.Wait()
					if limited && werr == nil && st.TimedOut {
						timedOut = true // read after events is closed
						return
					}
					select {
					case events <- &process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(st, werr)}}:
					case <-ctx.Done():
					}
				}
				return
			}
		}
	}()
	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if timedOut {
					return errDeadline
				}
				return leave(ctx)
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-tick:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return leave(ctx)
		}
	}
}

// endEvent is envd's end of a process: its exit code (128+n for signal n, as a shell says
// it), and a status as Go's os.ProcessState spells it.
func endEvent(st supervisor.ExitStatus, err error) *process.ProcessEvent_EndEvent {
	if err != nil {
		msg := err.Error()
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "lost", Error: &msg}
	}
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(st.ExitCode), Exited: true, Status: "exit status " + strconv.Itoa(st.ExitCode)}
	if st.Signal != "" {
		end.Exited = false
		end.Status = "signal: " + strings.ToLower(strings.TrimPrefix(st.Signal, "SIG"))
	}
	if st.TimedOut {
		msg := "the process ran out of its time and was killed"
		end.Error = &msg
	}
	return end
}

// keepalive is the interval a stream's client asks keepalive events at (seconds in the
// Keepalive-Ping-Interval header); 0 for none.
func keepalive(h interface{ Get(string) string }) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return 0
	}
	return min(time.Duration(n)*time.Second, maxKeepalive)
}

func startEvent(pid uint32) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}
}

// execRequest maps envd's process config onto bothyd's workload.
func execRequest(cfg *process.ProcessConfig, pty *process.PTY, user string) supervisor.ExecRequest {
	req := supervisor.ExecRequest{Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Cwd: cfg.GetCwd(), User: user}
	if req.Cwd != "" {
		// As envd: a relative working directory (or ~) is taken from the user's home; no
		// working directory is the home, as the agent starts a workload there.
		if cwd, err := resolvePath(req.Cwd, user); err == nil {
			req.Cwd = cwd
		}
	}
	for _, k := range slices.Sorted(maps.Keys(cfg.GetEnvs())) {
		req.Env = append(req.Env, k+"="+cfg.GetEnvs()[k])
	}
	if pty != nil {
		req.TTY = true
		req.Rows, req.Cols = uint16(min(pty.GetSize().GetRows(), 65535)), uint16(min(pty.GetSize().GetCols(), 65535))
	}
	return req
}

// Start runs a process. Its life is bounded by the call's Connect-Timeout-Ms (the agent
// kills it then), not by the call: a client that leaves leaves it running, to be re-attached
// to by Connect, killed by SendSignal, or ended with its sandbox.
func (s *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("name the command to run"))
	}
	id := sandboxOf(ctx)
	xreq := execRequest(cfg, req.Msg.Pty, userOfHeader(req.Header()))
	if dl, ok := ctx.Deadline(); ok {
		xreq.Timeout = max(time.Until(dl), time.Millisecond)
	}
	// A terminal's input is stdin too: SendInput's pty bytes.
	stdin := req.Msg.GetStdin() || req.Msg.Pty != nil
	att, err := s.h.sup.StartTracked(ctx, id, xreq, stdin, req.Msg.GetTag(), keptOf(cfg, req.Msg.Pty != nil))
	if err != nil {
		return startError(err)
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(startEvent(uint32(att.PID()))); err != nil {
		att.Close()
		return err
	}
	return relay(ctx, att, req.Msg.Pty != nil, true, keepalive(req.Header()), send)
}

// Connect re-attaches to a running process: its start event, then the latest output the
// agent holds (up to control.ProcReplayBytes of it), then its events from now on. A process
// started before a restart of bothyd is found as well.
func (s *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	pid, tag, err := selector(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	att, err := s.h.sup.AttachTracked(ctx, sandboxOf(ctx), pid, tag, true)
	if err != nil {
		return processError(err)
	}
	// Whether its output is a terminal's is kept with it in the agent.
	pty := false
	if l, err := s.h.sup.ListTracked(ctx, sandboxOf(ctx)); err == nil {
		for _, p := range l {
			if p.PID == att.PID() {
				_, pty = configOf(p)
			}
		}
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(startEvent(uint32(att.PID()))); err != nil {
		att.Close()
		return err
	}
	return relay(ctx, att, pty, false, keepalive(req.Header()), send)
}

// configOf is the config a process was started with, and whether it runs on a terminal:
// what bothyd kept with it, else what the agent knows (its argv and cwd).
func configOf(p supervisor.TrackedInfo) (*process.ProcessConfig, bool) {
	var k kept
	var cfg process.ProcessConfig
	if len(p.Client) > 0 && json.Unmarshal(p.Client, &k) == nil && protojson.Unmarshal(k.Config, &cfg) == nil {
		return &cfg, k.PTY
	}
	c := &process.ProcessConfig{}
	if len(p.Argv) > 0 {
		c.Cmd, c.Args = p.Argv[0], p.Argv[1:]
	}
	if p.Cwd != "" {
		c.Cwd = &p.Cwd
	}
	return c, k.PTY
}

func (s *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	procs, err := s.h.sup.ListTracked(ctx, sandboxOf(ctx))
	if err != nil {
		return nil, connectError(err)
	}
	out := &process.ListResponse{}
	for _, p := range procs {
		cfg, _ := configOf(p)
		info := &process.ProcessInfo{Config: cfg, Pid: uint32(p.PID)}
		if p.Tag != "" {
			info.Tag = &p.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// input gives the selected process input through its agent.
func (s *processService) input(ctx context.Context, sel *process.ProcessSelector, in supervisor.TrackedInput) error {
	pid, tag, err := selector(sel)
	if err != nil {
		return err
	}
	if err := s.h.sup.InputTracked(ctx, sandboxOf(ctx), pid, tag, in); err != nil {
		return processError(err)
	}
	return nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	in := req.Msg.GetInput()
	data := in.GetStdin()
	if data == nil {
		data = in.GetPty()
	}
	if err := s.input(ctx, req.Msg.GetProcess(), supervisor.TrackedInput{Stdin: data}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput feeds a process its input from a client stream: a start event naming the
// process, then data events, each handed to the agent as SendInput's are; keepalive events
// carry nothing. The end of the stream closes nothing (CloseStdin does). Client streams
// work over HTTP/1.1 in the Connect protocol (the request body is the stream, the answer
// follows its end); the SDKs send SendInput instead.
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var sel *process.ProcessSelector
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
			if _, _, err := selector(sel); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Data:
			if sel == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("name the process in a start event before its input"))
			}
			in := ev.Data.GetInput()
			data := in.GetStdin()
			if data == nil {
				data = in.GetPty()
			}
			if err := s.input(ctx, sel, supervisor.TrackedInput{Stdin: data}); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Keepalive:
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("an input event is none of start, data and keepalive"))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	if err := s.input(ctx, req.Msg.GetProcess(), supervisor.TrackedInput{EOF: true}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (s *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	var name string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		name = "KILL"
	case process.Signal_SIGNAL_SIGTERM:
		name = "TERM"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the signal is none of SIGKILL and SIGTERM"))
	}
	if err := s.input(ctx, req.Msg.GetProcess(), supervisor.TrackedInput{Signal: name}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (s *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	size := req.Msg.GetPty().GetSize()
	if size == nil || size.GetRows() == 0 || size.GetCols() == 0 {
		return connect.NewResponse(&process.UpdateResponse{}), nil
	}
	in := supervisor.TrackedInput{Rows: uint16(min(size.GetRows(), 65535)), Cols: uint16(min(size.GetCols(), 65535))}
	if err := s.input(ctx, req.Msg.GetProcess(), in); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// runQuiet runs a helper command (mv for Move) to its end, without tracking it, and returns
// its combined output (the first 4 KiB) and exit code.
func (h *Handler) runQuiet(ctx context.Context, id string, req supervisor.ExecRequest) (string, int, error) {
	sess, err := h.sup.StartProcess(ctx, id, req)
	if err != nil {
		return "", 0, err
	}
	defer sess.Close()
	_ = sess.CloseStdin()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	var out strings.Builder
	buf := make([]byte, 4096)
	for {
		_, n, err := sess.ReadOutput(buf)
		if out.Len() < 4096 {
			out.Write(buf[:min(n, 4096-out.Len())])
		}
		if err != nil {
			break
		}
	}
	st, err := sess.Wait()
	if err != nil {
		return "", 0, err
	}
	return strings.TrimSpace(out.String()), st.ExitCode, nil
}

// parseBasic reads HTTP basic authentication ("Basic base64(user:password)").
func parseBasic(h string) (user, password string, ok bool) {
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return "", "", false
	}
	user, password, ok = strings.Cut(string(b), ":")
	return user, password, ok
}
