package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/bothy/bothy/control"
)

var _ control.ProcessTracker = (*agent)(nil)

// trackedTable holds the agent's tracked processes (control.FeatureProcs), by pid. They
// belong to the agent, not to a control connection: a client that leaves, its connection's
// end and a restart of bothyd leave them running, and the next client finds them here.
type trackedTable struct {
	mu    sync.Mutex
	byPID map[int]*trackedProc
}

// trackedProc is one tracked process: an exec workload (the agent's own Exec, through a
// control.LocalExec) whose output is kept in a bounded replay buffer and handed to every
// attached stream.
//
// The buffer holds the latest output, at most control.ProcReplayBytes (and one piece more).
// Every attachment has a cursor into it; output that would push a piece out of the buffer
// before an attachment took it waits instead, so an attached stream that does not read stalls
// the workload (as exec's flow control does), while with nobody attached the oldest output
// is dropped. An attachment that leaves takes its cursor with it and so never holds the
// workload.
type trackedProc struct {
	pid    int
	tag    string
	argv   []string
	cwd    string
	client []byte
	local  *control.LocalExec
	// inputMu orders the input calls of several clients.
	inputMu sync.Mutex

	mu      sync.Mutex
	cond    *sync.Cond
	chunks  []outChunk
	base    int // the index of chunks[0] in the whole output
	size    int // bytes in chunks
	cursors map[*int]struct{}
	exited  bool
	status  control.ExitStatus
	err     error
}

type outChunk struct {
	t control.FrameType
	b []byte
}

// StartTracked implements control.ProcessTracker.
func (a *agent) StartTracked(ctx context.Context, req *control.ProcRequest, s *control.AttachStream) (control.ExitStatus, error) {
	if a.stopping.Load() {
		return control.ExitStatus{}, control.ErrShuttingDown
	}
	a.tracked.mu.Lock()
	n := len(a.tracked.byPID)
	a.tracked.mu.Unlock()
	if n >= control.MaxTrackedProcs {
		return control.ExitStatus{}, &control.RemoteError{Code: control.CodeLimitReached,
			Message: fmt.Sprintf("%d processes run already, the most a sandbox tracks; wait for one to end or kill one.", control.MaxTrackedProcs)}
	}
	exec := *req.Exec
	p := &trackedProc{tag: req.Tag, argv: exec.Argv, cwd: exec.Cwd, client: req.Client, cursors: map[*int]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	// The start's own attachment takes everything from the first byte: its cursor is in
	// place before the workload can print.
	cur := new(int)
	p.cursors[cur] = struct{}{}
	started := make(chan int, 1)
	p.local = control.NewLocalExec(exec.Stdin, func(t control.FrameType, b []byte) error {
		switch t {
		case control.FrameStarted:
			var st control.Started
			if err := json.Unmarshal(b, &st); err != nil {
				return err
			}
			p.pid = st.PID
			a.tracked.mu.Lock()
			if a.tracked.byPID == nil {
				a.tracked.byPID = map[int]*trackedProc{}
			}
			a.tracked.byPID[st.PID] = p
			a.tracked.mu.Unlock()
			started <- st.PID
		case control.FrameStdout, control.FrameStderr:
			p.append(t, b)
		}
		return nil
	})
	ended := make(chan error, 1)
	go func() {
		// The workload belongs to no client: only its exit, its timeout, a kill signal or
		// the sandbox's shutdown end it.
		st, err := a.Exec(context.Background(), &exec, p.local.Stream())
		p.local.Finish()
		p.finish(st, err)
		if p.pid != 0 {
			a.tracked.mu.Lock()
			delete(a.tracked.byPID, p.pid)
			a.tracked.mu.Unlock()
		}
		ended <- err
	}()
	select {
	case pid := <-started:
		if err := s.Started(pid); err != nil {
			p.detach(cur)
			return control.ExitStatus{}, err
		}
	case err := <-ended:
		// It did not start (a Started would have come first).
		if err == nil {
			err = &control.RemoteError{Code: control.CodeInternal, Message: "The process ended before it started."}
		}
		return control.ExitStatus{}, err
	}
	return p.follow(ctx, cur, s)
}

// AttachTracked implements control.ProcessTracker.
func (a *agent) AttachTracked(ctx context.Context, req *control.ProcRequest, s *control.AttachStream) (control.ExitStatus, error) {
	p, err := a.findTracked(req)
	if err != nil {
		return control.ExitStatus{}, err
	}
	p.mu.Lock()
	cur := new(int)
	*cur = p.base + len(p.chunks)
	if req.Replay {
		*cur = p.base
	}
	p.cursors[cur] = struct{}{}
	p.mu.Unlock()
	if err := s.Started(p.pid); err != nil {
		p.detach(cur)
		return control.ExitStatus{}, err
	}
	return p.follow(ctx, cur, s)
}

// ListTracked implements control.ProcessTracker: the running processes by pid, as many as
// fit one frame.
func (a *agent) ListTracked(context.Context) (control.ProcList, error) {
	a.tracked.mu.Lock()
	procs := slices.Collect(maps.Values(a.tracked.byPID))
	a.tracked.mu.Unlock()
	slices.SortFunc(procs, func(x, y *trackedProc) int { return x.pid - y.pid })
	var l control.ProcList
	size := 0
	for _, p := range procs {
		info := control.ProcInfo{PID: p.pid, Tag: p.tag, Argv: p.argv, Cwd: p.cwd, Client: p.client}
		b, _ := json.Marshal(info)
		if size+len(b) > control.MaxFramePayload/2 {
			l.Truncated = true
			break
		}
		size += len(b) + 1
		l.Processes = append(l.Processes, info)
	}
	return l, nil
}

// InputTracked implements control.ProcessTracker.
func (a *agent) InputTracked(ctx context.Context, req *control.ProcRequest) error {
	p, err := a.findTracked(req)
	if err != nil {
		return err
	}
	p.inputMu.Lock()
	defer p.inputMu.Unlock()
	if len(req.Stdin) > 0 {
		if err := p.local.Stdin(ctx, req.Stdin); err != nil {
			return err
		}
	}
	if req.EOF {
		p.local.CloseStdin()
	}
	if req.Signal != "" {
		if err := p.local.Signal(ctx, req.Signal); err != nil {
			return err
		}
	}
	if req.Resize != nil {
		return p.local.Resize(ctx, *req.Resize)
	}
	return nil
}

// findTracked selects a running process by pid, or by tag (the oldest of that tag).
func (a *agent) findTracked(req *control.ProcRequest) (*trackedProc, error) {
	a.tracked.mu.Lock()
	defer a.tracked.mu.Unlock()
	if req.PID > 0 {
		if p := a.tracked.byPID[req.PID]; p != nil {
			return p, nil
		}
		return nil, &control.RemoteError{Code: control.CodeProcessNotFound, Message: fmt.Sprintf("No tracked process with pid %d runs in the sandbox.", req.PID)}
	}
	var found *trackedProc
	for _, p := range a.tracked.byPID {
		if p.tag == req.Tag && (found == nil || p.pid < found.pid) {
			found = p
		}
	}
	if found == nil {
		return nil, &control.RemoteError{Code: control.CodeProcessNotFound, Message: fmt.Sprintf("No tracked process tagged %q runs in the sandbox.", truncate(req.Tag))}
	}
	return found, nil
}

// append adds a piece of output, dropping the oldest output past the buffer's bound, but
// waiting while an attachment has not taken what would be dropped.
func (p *trackedProc) append(t control.FrameType, b []byte) {
	c := outChunk{t: t, b: bytes.Clone(b)}
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.chunks) > 0 && p.size+len(c.b) > control.ProcReplayBytes {
		if p.laggingLocked() {
			p.cond.Wait()
			continue
		}
		p.size -= len(p.chunks[0].b)
		p.chunks[0] = outChunk{}
		p.chunks = p.chunks[1:]
		p.base++
	}
	p.chunks = append(p.chunks, c)
	p.size += len(c.b)
	p.cond.Broadcast()
}

// laggingLocked reports whether an attachment has yet to take the oldest piece.
func (p *trackedProc) laggingLocked() bool {
	for cur := range p.cursors {
		if *cur <= p.base {
			return true
		}
	}
	return false
}

func (p *trackedProc) finish(st control.ExitStatus, err error) {
	p.mu.Lock()
	p.exited, p.status, p.err = true, st, err
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *trackedProc) detach(cur *int) {
	p.mu.Lock()
	delete(p.cursors, cur)
	p.cond.Broadcast()
	p.mu.Unlock()
}

// follow sends the output from cur on until the process ended (then its status) or ctx ends
// (the client detached).
func (p *trackedProc) follow(ctx context.Context, cur *int, s *control.AttachStream) (control.ExitStatus, error) {
	defer p.detach(cur)
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	for {
		p.mu.Lock()
		for *cur >= p.base+len(p.chunks) && !p.exited && ctx.Err() == nil {
			p.cond.Wait()
		}
		if err := ctx.Err(); err != nil {
			p.mu.Unlock()
			return control.ExitStatus{}, err
		}
		if *cur < p.base {
			*cur = p.base // output dropped before this attachment came: it starts at the oldest
		}
		if *cur < p.base+len(p.chunks) {
			c := p.chunks[*cur-p.base]
			*cur++
			p.cond.Broadcast()
			p.mu.Unlock()
			if err := s.Output(c.t, c.b); err != nil {
				return control.ExitStatus{}, err
			}
			continue
		}
		st, err := p.status, p.err
		p.mu.Unlock()
		return st, err
	}
}
