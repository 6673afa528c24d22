package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/e2b/envd/process"
	"github.com/sandboxd/sandboxd/e2b/envd/process/processconnect"
	"github.com/sandboxd/sandboxd/supervisor"
)

// maxKeepalive bounds the keepalive interval a client may ask for; outputChunk is the size of
// one data event at most.
const (
	maxKeepalive = 5 * time.Minute
	outputChunk  = 32 << 10
)

// processService implements envd's process service over [Supervisor.StartProcess].
type processService struct {
	processconnect.UnimplementedProcessHandler
	h *Handler
}

// sandboxProcs are one sandbox's tracked processes, by pid.
type sandboxProcs struct {
	mu    sync.Mutex
	procs map[uint32]*proc
}

// proc is one tracked process: its session, and the streams attached to it. Its output is
// fanned out to every attached stream; a stream that does not keep up stalls the process,
// through the agent's flow control, rather than losing output.
type proc struct {
	pid    uint32
	tag    string
	config *process.ProcessConfig
	pty    bool

	sessMu sync.Mutex // serializes the session's input calls, which must not overlap
	sess   *supervisor.Session

	mu   sync.Mutex
	subs map[*sub]struct{}
	done bool
}

// sub is one attached stream.
type sub struct {
	ch   chan *process.ProcessEvent
	gone chan struct{} // closed when the stream's handler returns
}

func (t *procTable) sandbox(id string) *sandboxProcs {
	t.mu.Lock()
	defer t.mu.Unlock()
	sp := t.byID[id]
	if sp == nil {
		sp = &sandboxProcs{procs: map[uint32]*proc{}}
		t.byID[id] = sp
	}
	return sp
}

// forget closes the sessions of a sandbox that is gone, and drops its table.
func (t *procTable) forget(id string) {
	t.mu.Lock()
	sp := t.byID[id]
	delete(t.byID, id)
	t.mu.Unlock()
	if sp == nil {
		return
	}
	sp.mu.Lock()
	procs := slices.Collect(maps.Values(sp.procs))
	sp.mu.Unlock()
	for _, p := range procs {
		p.sess.Close()
	}
}

// find selects a process by pid or tag.
func (sp *sandboxProcs) find(sel *process.ProcessSelector) (*proc, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p := sp.procs[s.Pid]; p != nil {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("there is no process with pid %d", s.Pid))
	case *process.ProcessSelector_Tag:
		for _, p := range sp.procs {
			if p.tag == s.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("there is no process tagged %q", s.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("select the process by pid or tag"))
}

// subscribe attaches a stream; it is nil when the process has ended.
func (p *proc) subscribe() *sub {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil
	}
	s := &sub{ch: make(chan *process.ProcessEvent, 16), gone: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s
}

func (p *proc) unsubscribe(s *sub) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// broadcast hands ev to every attached stream, waiting for each but those that left.
func (p *proc) broadcast(ev *process.ProcessEvent) {
	p.mu.Lock()
	subs := slices.Collect(maps.Keys(p.subs))
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

// pump relays the process's output to its streams until it ends, then its end, and then
// closes the streams and forgets the process.
func (p *proc) pump(sp *sandboxProcs) {
	buf := make([]byte, outputChunk)
	for {
		stream, n, err := p.sess.ReadOutput(buf)
		if n > 0 {
			data := slices.Clone(buf[:n])
			ev := &process.ProcessEvent_DataEvent{}
			switch {
			case p.pty:
				ev.Output = &process.ProcessEvent_DataEvent_Pty{Pty: data}
			case stream == supervisor.Stderr:
				ev.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: data}
			default:
				ev.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: data}
			}
			p.broadcast(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: ev}})
		}
		if err != nil {
			break
		}
	}
	p.broadcast(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(p.sess.Wait())}})
	p.sess.Close()
	sp.mu.Lock()
	delete(sp.procs, p.pid)
	sp.mu.Unlock()
	p.mu.Lock()
	p.done = true
	subs := slices.Collect(maps.Keys(p.subs))
	p.subs = nil
	p.mu.Unlock()
	for _, s := range subs {
		close(s.ch)
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

// follow relays s's events to send until the process ends or the client leaves. The
// process outlives its client: E2B's background commands are re-attached to by Connect.
func follow(ctx context.Context, p *proc, s *sub, interval time.Duration, send func(*process.ProcessEvent) error) error {
	defer p.unsubscribe(s)
	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-s.ch:
			if !ok {
				return nil
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-tick:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func startEvent(pid uint32) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}
}

// execRequest maps envd's process config onto sandboxd's workload.
func execRequest(cfg *process.ProcessConfig, pty *process.PTY, user string) supervisor.ExecRequest {
	req := supervisor.ExecRequest{Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Cwd: cfg.GetCwd(), User: user}
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
	sess, err := s.h.sup.StartProcess(ctx, id, xreq)
	if err != nil {
		return connectError(err)
	}
	if !req.Msg.GetStdin() {
		_ = sess.CloseStdin()
	}
	sp := s.h.procs.sandbox(id)
	p := &proc{pid: uint32(sess.PID()), tag: req.Msg.GetTag(), config: cfg, pty: req.Msg.Pty != nil, sess: sess, subs: map[*sub]struct{}{}}
	sp.mu.Lock()
	sp.procs[p.pid] = p
	sp.mu.Unlock()
	sb := p.subscribe()
	go p.pump(sp)
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		p.unsubscribe(sb)
		return err
	}
	return follow(ctx, p, sb, keepalive(req.Header()), send)
}

// Connect re-attaches to a running process: its start event, then its events from now on.
func (s *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	p, err := s.h.procs.sandbox(sandboxOf(ctx)).find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sb := p.subscribe()
	if sb == nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("the process with pid %d has ended", p.pid))
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		p.unsubscribe(sb)
		return err
	}
	return follow(ctx, p, sb, keepalive(req.Header()), send)
}

func (s *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	sp := s.h.procs.sandbox(sandboxOf(ctx))
	sp.mu.Lock()
	out := &process.ListResponse{}
	for _, p := range sp.procs {
		info := &process.ProcessInfo{Config: p.config, Pid: p.pid}
		if p.tag != "" {
			info.Tag = &p.tag
		}
		out.Processes = append(out.Processes, info)
	}
	sp.mu.Unlock()
	slices.SortFunc(out.Processes, func(a, b *process.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
	return connect.NewResponse(out), nil
}

// withProc runs f on the selected process's session, one input call at a time.
func (s *processService) withProc(ctx context.Context, sel *process.ProcessSelector, f func(*supervisor.Session) error) error {
	p, err := s.h.procs.sandbox(sandboxOf(ctx)).find(sel)
	if err != nil {
		return err
	}
	p.sessMu.Lock()
	defer p.sessMu.Unlock()
	if err := f(p.sess); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return nil
}

func (s *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	in := req.Msg.GetInput()
	data := in.GetStdin()
	if data == nil {
		data = in.GetPty()
	}
	err := s.withProc(ctx, req.Msg.GetProcess(), func(x *supervisor.Session) error { return x.WriteStdin(data) })
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	if err := s.withProc(ctx, req.Msg.GetProcess(), (*supervisor.Session).CloseStdin); err != nil {
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
	if err := s.withProc(ctx, req.Msg.GetProcess(), func(x *supervisor.Session) error { return x.Signal(name) }); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (s *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	size := req.Msg.GetPty().GetSize()
	if size == nil {
		return connect.NewResponse(&process.UpdateResponse{}), nil
	}
	err := s.withProc(ctx, req.Msg.GetProcess(), func(x *supervisor.Session) error {
		return x.Resize(uint16(min(size.GetRows(), 65535)), uint16(min(size.GetCols(), 65535)))
	})
	if err != nil {
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
