package control

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/bothy/bothy/platform"
)

// FeatureStdoutPipe is announced by an agent that takes an exec's stdout as a pipe passed with
// the request ([ExecRequest.StdoutPipe]), on a connection over a unix socket. bothyd makes
// the pipe, passes its write end and reads the workload's stdout straight from the read end:
// the bulk of a stream skips the agent, yamux and the frames (two copies by the kernel and one
// in each process fewer). Stderr, the exit and everything else still travel on the exec's
// stream. Over any other connection (a microVM's serial port) it is neither announced nor
// used, and nothing else changes.
//
// The agent's rules for stdout hold for the pipe, kept by the client: it reads the pipe until
// every writer closed it or, once the exit frame came, until it stayed silent for
// [OutputDrainIdle]; then it closes its end, so that what a background process prints later
// meets a closed pipe, as it did at the agent.
const FeatureStdoutPipe = "stdout-pipe"

// StdoutPipeUser is what a [Handler] implements to announce [FeatureStdoutPipe]: its Exec
// makes [ExecStream.StdoutPipe], when not nil, the workload's stdout.
type StdoutPipeUser interface {
	UsesStdoutPipes()
}

// OutputDrainIdle is how long a workload's output is still read after it exited while its
// pipes stay open but silent: a background process that inherited them must not hold the exec
// open forever, but output already on its way is not cut.
const OutputDrainIdle = 100 * time.Millisecond

// OutputPipeSize is the capacity asked for a workload's output pipes: a reader takes up to
// that much per read, however far the workload is ahead. It is part of what a workload may
// write ahead of a client that does not read.
const OutputPipeSize = 1 << 20

// passStdoutPipe makes the pipe for an exec's stdout, names its write end in req and queues it
// to travel with the request. It returns the read end.
func (c *Client) passStdoutPipe(req *ExecRequest) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	platform.GrowPipe(r, OutputPipeSize)
	n, err := c.fds.send(w)
	if err != nil {
		r.Close()
		return nil, err
	}
	req.StdoutPipe = n
	return r, nil
}

// pipedOutput is the output of a Process whose stdout comes through a pipe: the read end, and
// the stream's output (stderr) and end (the exit), which a goroutine of their own reads
// (readStream) so that neither source waits behind the other.
type pipedOutput struct {
	f      *os.File
	pieces chan streamPiece // stream output not handed out yet
	ended  chan struct{}    // closed once readStream stopped; end says why
	end    error            // io.EOF at the exit frame, else what ended the stream
	quit   chan struct{}    // closed (by stop) when nobody will take more pieces
	once   sync.Once

	// Only the reader of the output touches these.
	rest       streamPiece
	stdoutDone bool
}

// streamPiece is a piece of output that came on the stream.
type streamPiece struct {
	t FrameType
	b []byte
}

// streamPieceQueue bounds the pieces the stream reader holds that were not handed out: past
// it, it stops reading, and yamux's window stops the agent.
const streamPieceQueue = 4

// streamPieceSize is the most one piece holds.
const streamPieceSize = 32 << 10

func newPipedOutput(f *os.File) *pipedOutput {
	return &pipedOutput{f: f, pieces: make(chan streamPiece, streamPieceQueue), ended: make(chan struct{}), quit: make(chan struct{})}
}

// wake ends a read of the pipe that is under way, or the next one, at once: the reader then
// looks at the stream again.
func (o *pipedOutput) wake() { _ = o.f.SetReadDeadline(time.Unix(1, 0)) }

func (o *pipedOutput) stop() { o.once.Do(func() { close(o.quit) }) }

// close ends the stream reader's hand-over and closes the read end: nobody reads on.
func (o *pipedOutput) close() {
	o.stop()
	o.f.Close()
}

// readStream reads the stream's frames until its end, queuing their output.
func (p *Process) readStream() {
	o := p.pipe
	defer func() {
		close(o.ended)
		o.wake()
	}()
	var b []byte
	for {
		if b == nil {
			b = make([]byte, streamPieceSize)
		}
		t, n, err := p.nextFrame(b)
		if n > 0 {
			select {
			case o.pieces <- streamPiece{t: t, b: b[:n]}:
				b = nil
				o.wake()
			case <-o.quit:
				o.end = fmt.Errorf("%w: nobody reads the output", ErrNoExit)
				return
			}
		}
		if err != nil {
			o.end = err
			return
		}
	}
}

// nextPiped is next for a Process with a stdout pipe: the stream's pieces first, else what the
// pipe has, until both ended.
func (p *Process) nextPiped(b []byte) (FrameType, int, error) {
	o := p.pipe
	for {
		if len(o.rest.b) > 0 {
			n := copy(b, o.rest.b)
			o.rest.b = o.rest.b[n:]
			return o.rest.t, n, nil
		}
		if p.closedEarly.Load() {
			return 0, 0, fmt.Errorf("%w: the exec was closed before it ended", ErrNoExit)
		}
		ended := isClosed(o.ended)
		exited := ended && o.end == io.EOF
		var drainBy time.Time
		if exited {
			drainBy = time.Now().Add(OutputDrainIdle)
		}
		// Set before looking at the stream: a wake-up from here on ends the read below.
		_ = o.f.SetReadDeadline(drainBy)
		select {
		case o.rest = <-o.pieces:
			continue
		default:
		}
		if ended && (!exited || o.stdoutDone) {
			return 0, 0, o.end
		}
		if o.stdoutDone {
			select {
			case o.rest = <-o.pieces:
			case <-o.ended:
			}
			continue
		}
		n, err := o.f.Read(b)
		switch {
		case n > 0:
			return FrameStdout, n, nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Woken, or silent for the drain's time after the exit.
			o.stdoutDone = exited && !time.Now().Before(drainBy)
		case err != nil:
			// io.EOF: every writer closed it.
			o.stdoutDone = true
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
