package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// Process is a running workload started by Exec.
//
// Stdout and Stderr must both be read (concurrently, or Stderr discarded) until EOF: output
// is delivered in the order the agent sent it over one stream, so a reader that stops
// stalls the other and, through the flow control, the workload itself. Wait returns once
// both reached EOF and the exit status arrived.
type Process struct {
	// PID is the workload's pid inside the sandbox.
	PID int
	// Stdin writes to the workload's stdin; Close sends end-of-file. It is nil unless the
	// request set Stdin.
	Stdin io.WriteCloser
	// Stdout is the workload's stdout; with TTY it is the terminal's output.
	Stdout io.Reader
	// Stderr is the workload's stderr; with TTY it is empty.
	Stderr io.Reader

	c      *Client
	st     *yamux.Stream
	fw     *frameWriter
	outR   *io.PipeReader
	errR   *io.PipeReader
	outW   *io.PipeWriter
	errW   *io.PipeWriter
	done   chan struct{}
	status ExitStatus
	err    error
	once   sync.Once
	// closedEarly records a Close before the exit: Wait then reports ErrNoExit even if the
	// agent's exit frame still arrives, so a caller sees one outcome for one action.
	closedEarly atomic.Bool
}

// ErrNoExit is the error Wait returns when the stream ended without an exit status: the
// process was closed, or the agent or the connection died.
var ErrNoExit = errors.New("control: the exec ended without an exit status")

// Exec starts a workload. ctx bounds only the start: once Exec returned, the workload runs
// until it exits, its timeout passes, or Close (or the connection's end) makes the agent kill
// it. A workload that cannot start (no such command, a bad cwd) is an error here, not an exit
// status.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (*Process, error) {
	if err := req.Validate(); err != nil {
		return nil, asRemote(err).Err()
	}
	st, fw, stop, err := c.open(ctx, Header{Op: OpExec, Exec: &req})
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
		return nil, fmt.Errorf("control: unexpected %s frame starting an exec", t)
	}
	var s Started
	if err := json.Unmarshal(p, &s); err != nil {
		st.Close()
		return nil, fmt.Errorf("control: malformed started frame: %w", err)
	}
	pr := &Process{PID: s.PID, c: c, st: st, fw: fw, done: make(chan struct{})}
	pr.outR, pr.outW = io.Pipe()
	pr.errR, pr.errW = io.Pipe()
	pr.Stdout, pr.Stderr = pr.outR, pr.errR
	if req.Stdin {
		pr.Stdin = &stdinWriter{fw: fw}
	}
	go pr.demux()
	return pr, nil
}

// demux hands the output frames to the pipes (blocking while the caller does not read, which
// stops reading the stream and so, through yamux's window, the agent and the workload) until
// the exit frame.
func (p *Process) demux() {
	defer close(p.done)
	err := p.readFrames()
	if err == nil && p.closedEarly.Load() {
		err = fmt.Errorf("%w: the exec was closed before it ended", ErrNoExit)
	}
	p.err = err
	if err != nil {
		p.outW.CloseWithError(err)
		p.errW.CloseWithError(err)
	} else {
		p.outW.Close()
		p.errW.Close()
	}
	p.st.Close()
}

func (p *Process) readFrames() error {
	var buf []byte
	for {
		t, payload, err := ReadFrame(p.st, buf)
		if err != nil {
			if p.c.sess.IsClosed() {
				return fmt.Errorf("%w: %w", ErrNoExit, ErrClosed)
			}
			return fmt.Errorf("%w: %w", ErrNoExit, err)
		}
		buf = payload[:0]
		switch t {
		case FrameStdout:
			if _, err := p.outW.Write(payload); err != nil {
				return fmt.Errorf("%w: stdout closed", ErrNoExit)
			}
		case FrameStderr:
			if _, err := p.errW.Write(payload); err != nil {
				return fmt.Errorf("%w: stderr closed", ErrNoExit)
			}
		case FrameExit:
			if err := json.Unmarshal(payload, &p.status); err != nil {
				return fmt.Errorf("control: malformed exit frame: %w", err)
			}
			return nil
		case FrameError:
			return decodeRemoteError(payload)
		default:
			return fmt.Errorf("control: unexpected %s frame in an exec", t)
		}
	}
}

// Wait waits for the exit status. Stdout and Stderr must be drained for it to return.
func (p *Process) Wait() (ExitStatus, error) {
	<-p.done
	return p.status, p.err
}

// Done is closed when the exec ended (Wait will not block).
func (p *Process) Done() <-chan struct{} { return p.done }

// Resize changes the terminal size of a TTY exec.
func (p *Process) Resize(rows, cols uint16) error {
	return writeJSON(p.fw, FrameResize, WindowSize{Rows: rows, Cols: cols})
}

// Signal sends a signal ("TERM", "INT", "KILL", ...) to the workload's process group.
func (p *Process) Signal(name string) error {
	return writeJSON(p.fw, FrameSignal, SignalRequest{Name: name})
}

// Close ends the exec. If the workload still runs the agent kills it (the client is gone, by
// the protocol's rule) and Wait returns ErrNoExit. Close after the exit only frees the
// stream.
func (p *Process) Close() error {
	p.once.Do(func() {
		select {
		case <-p.done:
		default:
			p.closedEarly.Store(true)
		}
		p.st.Close()
		// The agent answers a close within moments; a dead one must not hold demux forever.
		p.st.SetReadDeadline(time.Now().Add(closeLinger))
		p.outR.CloseWithError(ErrNoExit)
		p.errR.CloseWithError(ErrNoExit)
	})
	return nil
}

type stdinWriter struct {
	fw     *frameWriter
	mu     sync.Mutex
	closed bool
}

func (w *stdinWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, io.ErrClosedPipe
	}
	sw := frameStreamWriter{fw: w.fw, typ: FrameStdin, chunk: chunkSize}
	return sw.Write(b)
}

func (w *stdinWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	return w.fw.write(FrameEOF, nil)
}
