package control

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// ExecStream is the agent's side of one exec stream, handed to Handler.Exec.
type ExecStream struct {
	fw         *frameWriter
	stdoutPipe *os.File
	stdin      *stdinReader
	stdout     frameStreamWriter
	stderr     frameStreamWriter
	resize     chan WindowSize
	signals    chan string
}

// stdinQueueLen bounds how many stdin frames the agent holds that the workload has not read
// yet (each at most MaxFramePayload). Past it the agent stops reading the stream, and yamux's
// window stops the client: backpressure, not buffering.
const stdinQueueLen = 4

// Stdin returns what the client sends as stdin, ending with io.EOF at the client's eof frame
// or when the exec ends. It is nil when the request asked for no stdin.
func (s *ExecStream) Stdin() io.Reader {
	if s.stdin == nil {
		return nil
	}
	return s.stdin
}

// Stdout writes stdout frames (the terminal's output with TTY). A write blocks while the
// client is not reading: that is the flow control.
func (s *ExecStream) Stdout() io.Writer { return &s.stdout }

// StdoutPipe is the write end of the pipe bothyd passed for the workload's stdout
// ([FeatureStdoutPipe]), or nil: stdout then goes to Stdout. The handler gives it to the
// workload and may close it once the workload holds it; Serve closes it after Exec returned.
func (s *ExecStream) StdoutPipe() *os.File { return s.stdoutPipe }

// Stderr writes stderr frames.
func (s *ExecStream) Stderr() io.Writer { return &s.stderr }

// Resizes delivers the client's terminal size changes; when they come faster than the handler
// applies them, only the latest is kept. With OnResize set, those sent while stdin is open go
// there instead.
func (s *ExecStream) Resizes() <-chan WindowSize { return s.resize }

// OnResize makes the stdin reader apply the client's terminal size changes itself, in their
// place among the stdin bytes: fn is called from Stdin's Read once everything sent before the
// change was returned (and so written by the caller's copy loop), and before anything sent
// after it. A client that resizes and then types sees its command run at the new size. Set it
// before reading Stdin.
func (s *ExecStream) OnResize(fn func(WindowSize)) {
	if s.stdin != nil {
		s.stdin.onResize = fn
	}
}

// Signals delivers the names of the signals the client sends, as it spelled them (validate
// them); the handler sends them to the workload.
func (s *ExecStream) Signals() <-chan string { return s.signals }

// Started tells the client that the workload runs. Call it once, before any output; an
// Exec that returns an error without having called it reports a failed start.
func (s *ExecStream) Started(pid int) error {
	return writeJSON(s.fw, FrameStarted, Started{PID: pid})
}

// stdinReader hands the stdin frames the stream reader queued to the handler's stdin pump,
// and the resizes queued among them to onResize.
type stdinReader struct {
	ch       chan stdinItem
	done     <-chan struct{}
	rest     []byte
	onResize func(WindowSize)
	resize   chan WindowSize // where resizes go without onResize
}

// stdinItem is a stdin frame's bytes, or a resize sent between stdin frames.
type stdinItem struct {
	data []byte
	size *WindowSize
}

func (r *stdinReader) Read(p []byte) (int, error) {
	for len(r.rest) == 0 {
		select {
		case it, ok := <-r.ch:
			if !ok {
				return 0, io.EOF
			}
			if it.size != nil {
				if r.onResize != nil {
					r.onResize(*it.size)
				} else {
					keepLatest(r.resize, *it.size)
				}
				continue
			}
			r.rest = it.data
		case <-r.done:
			return 0, io.EOF
		}
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

func (s *server) serveExec(ctx context.Context, st *yamux.Stream, fw *frameWriter, req *ExecRequest) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	es := &ExecStream{
		fw:      fw,
		stdout:  frameStreamWriter{fw: fw, typ: FrameStdout, chunk: outputChunkSize},
		stderr:  frameStreamWriter{fw: fw, typ: FrameStderr, chunk: outputChunkSize},
		resize:  make(chan WindowSize, 1),
		signals: make(chan string, 16),
	}
	if req.StdoutPipe != 0 {
		f, err := s.claimStdoutPipe(req)
		if err != nil {
			writeError(fw, err)
			return
		}
		defer f.Close()
		es.stdoutPipe = f
	}
	if req.Stdin {
		es.stdin = &stdinReader{ch: make(chan stdinItem, stdinQueueLen), done: done, resize: es.resize}
	}
	var readerDone sync.WaitGroup
	readerDone.Add(1)
	go func() {
		defer readerDone.Done()
		// Whatever ends this loop before the exec ended means the client is gone or broke
		// the protocol: either way nobody will read the output, so the workload is killed.
		defer cancel(errClientGone)
		readExecFrames(st, es, done)
	}()

	status, err := s.h.Exec(ctx, req, es)
	close(done)
	if err != nil {
		writeError(fw, err)
	} else {
		_ = writeJSON(fw, FrameExit, status)
	}
	// Unblock the frame reader if the client keeps the stream open: lingerClose in
	// serveStream gives the client a moment to close.
	st.SetReadDeadline(time.Now().Add(closeLinger))
	readerDone.Wait()
}

// claimStdoutPipe takes the pipe an exec request names. Only an agent that announced
// FeatureStdoutPipe is sent one, and only over a unix socket.
func (s *server) claimStdoutPipe(req *ExecRequest) (*os.File, error) {
	if _, ok := s.h.(StdoutPipeUser); !ok || s.fds == nil {
		return nil, invalidf("This agent takes no stdout pipe on this connection.")
	}
	return s.fds.claim(req.StdoutPipe)
}

func readExecFrames(st io.Reader, es *ExecStream, done <-chan struct{}) {
	stdinClosed := false
	var buf []byte
	for {
		t, p, err := ReadFrame(st, buf)
		if err != nil {
			return
		}
		buf = p[:0]
		switch t {
		case FrameStdin:
			if es.stdin == nil || stdinClosed {
				return
			}
			b := append([]byte(nil), p...)
			select {
			case es.stdin.ch <- stdinItem{data: b}:
			case <-done:
				return
			}
		case FrameEOF:
			if es.stdin != nil && !stdinClosed {
				stdinClosed = true
				close(es.stdin.ch)
			}
		case FrameResize:
			var ws WindowSize
			if json.Unmarshal(p, &ws) != nil {
				return
			}
			if es.stdin != nil && !stdinClosed {
				// In its place among the stdin bytes (see OnResize).
				select {
				case es.stdin.ch <- stdinItem{size: &ws}:
				case <-done:
					return
				}
				continue
			}
			keepLatest(es.resize, ws)
		case FrameSignal:
			var sr SignalRequest
			if json.Unmarshal(p, &sr) != nil || sr.Name == "" || len(sr.Name) > 16 {
				return
			}
			select {
			case es.signals <- strings.ToUpper(sr.Name):
			case <-done:
				return
			}
		default:
			return
		}
	}
}

// keepLatest puts ws into the one-slot channel c, replacing a size not taken yet. Only the
// stream reader and, with stdin, the stdin reader put; the handler takes.
func keepLatest(c chan WindowSize, ws WindowSize) {
	for {
		select {
		case c <- ws:
			return
		default:
		}
		select {
		case <-c:
		default:
		}
	}
}
