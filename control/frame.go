package control

import (
	"encoding/binary"
	"fmt"
	"io"
	"sync"
)

// FrameType names what a frame's payload is. The values are part of the wire protocol: never
// renumber one.
type FrameType byte

// The frame types. JSON payloads are marked; the others carry raw bytes or nothing.
const (
	FrameHeader  FrameType = 1  // JSON Header: the first frame of every stream, client to agent
	FrameStdin   FrameType = 2  // raw bytes for the workload's stdin
	FrameStdout  FrameType = 3  // raw bytes the workload wrote to stdout (or the tty)
	FrameStderr  FrameType = 4  // raw bytes the workload wrote to stderr
	FrameResize  FrameType = 5  // JSON WindowSize
	FrameSignal  FrameType = 6  // JSON SignalRequest
	FrameEOF     FrameType = 7  // empty: the client closed stdin
	FrameExit    FrameType = 8  // JSON ExitStatus: the last frame of an exec
	FrameError   FrameType = 9  // JSON RemoteError: the last frame of a failed operation
	FrameData    FrameType = 10 // raw file bytes, or a JSON []FileInfo batch for list
	FrameEnd     FrameType = 11 // empty: the end of a data sequence
	FrameResult  FrameType = 12 // JSON: the operation's answer (hello, stat, write, stats, ...)
	FrameStarted FrameType = 13 // JSON Started: the exec's workload is running
)

func (t FrameType) String() string {
	switch t {
	case FrameHeader:
		return "header"
	case FrameStdin:
		return "stdin"
	case FrameStdout:
		return "stdout"
	case FrameStderr:
		return "stderr"
	case FrameResize:
		return "resize"
	case FrameSignal:
		return "signal"
	case FrameEOF:
		return "eof"
	case FrameExit:
		return "exit"
	case FrameError:
		return "error"
	case FrameData:
		return "data"
	case FrameEnd:
		return "end"
	case FrameResult:
		return "result"
	case FrameStarted:
		return "started"
	}
	return fmt.Sprintf("frame(%d)", byte(t))
}

func (t FrameType) valid() bool { return t >= FrameHeader && t <= FrameStarted }

const (
	// frameHeaderSize is the type byte plus the big-endian payload length.
	frameHeaderSize = 5
	// MaxFramePayload bounds one frame's payload. A reader refuses a larger frame before
	// allocating anything, so a peer cannot make the other side buffer more than this.
	MaxFramePayload = 1 << 20
	// chunkSize is how much file data or stdin one frame carries when we produce it, and
	// what output is read into first (see outputBuffer). It is well below MaxFramePayload so
	// that a frame never holds more than a few yamux window updates.
	chunkSize = 32 << 10
	// outputChunkSize is how much of a workload's output one stdout or stderr frame carries
	// at most. Output is the bulk path: larger frames cost fewer frame headers, yamux writes
	// and wake-ups per byte, and a quarter of MaxFramePayload still lets stdout and stderr
	// interleave within a yamux window.
	outputChunkSize = 256 << 10
)

// ErrFrameTooLarge is returned by ReadFrame for a frame whose declared length exceeds
// MaxFramePayload, and by WriteFrame for a payload that large.
var ErrFrameTooLarge = fmt.Errorf("control: frame payload exceeds %d bytes", MaxFramePayload)

// ReadFrame reads one frame. buf is reused for the payload when it is large enough; the
// returned payload aliases it and is valid until the next call with the same buf. An unknown
// frame type or an oversized length is an error: the stream is then out of sync and must be
// dropped. A clean end of stream before the first header byte is io.EOF; one inside a frame is
// io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, buf []byte) (FrameType, []byte, error) {
	t, n, err := readFrameHeader(r)
	if err != nil {
		return 0, nil, err
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return t, buf, nil
}

// readFrameHeader reads a frame's header and checks it, as ReadFrame does, leaving the payload
// of n bytes to read.
func readFrameHeader(r io.Reader) (FrameType, int, error) {
	var hdr [frameHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, 0, err
	}
	t := FrameType(hdr[0])
	if !t.valid() {
		return 0, 0, fmt.Errorf("control: unknown frame type %d", hdr[0])
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFramePayload {
		return 0, 0, ErrFrameTooLarge
	}
	return t, int(n), nil
}

// WriteFrame writes one frame with a single Write call, so that a frame is never split when
// the writer is shared under a lock.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	if len(payload) > MaxFramePayload {
		return ErrFrameTooLarge
	}
	b := make([]byte, frameHeaderSize+len(payload))
	putFrameHeader(b, t, len(payload))
	copy(b[frameHeaderSize:], payload)
	_, err := w.Write(b)
	return err
}

func putFrameHeader(b []byte, t FrameType, n int) {
	b[0] = byte(t)
	binary.BigEndian.PutUint32(b[1:frameHeaderSize], uint32(n))
}

// frameWriter serialises the frames of several goroutines (stdout pump, stderr pump, the exit)
// onto one stream. A frame is written whole under the lock; the lock is held while yamux blocks
// for window, which is what gives the producers backpressure.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (fw *frameWriter) write(t FrameType, payload []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return WriteFrame(fw.w, t, payload)
}

// writePrepared writes a frame whose payload was read into b[frameHeaderSize:], saving a copy
// on the hot output path.
func (fw *frameWriter) writePrepared(t FrameType, b []byte) error {
	putFrameHeader(b, t, len(b)-frameHeaderSize)
	fw.mu.Lock()
	defer fw.mu.Unlock()
	_, err := fw.w.Write(b)
	return err
}

// frameStreamWriter turns Write calls into frames of one type, chunked to chunk bytes.
type frameStreamWriter struct {
	fw    *frameWriter
	typ   FrameType
	chunk int
}

func (s *frameStreamWriter) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		n := min(len(p), s.chunk)
		if err := s.fw.write(s.typ, p[:n]); err != nil {
			return total, err
		}
		total += n
		p = p[n:]
	}
	return total, nil
}

// ReadFrom lets io.Copy read straight into a frame buffer, without an intermediate copy. It
// serves the output streams, so its frames carry up to outputChunkSize bytes.
func (s *frameStreamWriter) ReadFrom(r io.Reader) (int64, error) {
	var buf outputBuffer
	defer buf.release()
	var total int64
	for {
		b := buf.bytes()
		n, err := r.Read(b[frameHeaderSize:])
		if n > 0 {
			if werr := s.fw.writePrepared(s.typ, b[:frameHeaderSize+n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		buf.used(n)
	}
}

// Output buffers: room for a frame header, then the payload.
var (
	smallBuffers = sync.Pool{New: func() any { return new([frameHeaderSize + chunkSize]byte) }}
	largeBuffers = sync.Pool{New: func() any { return new([frameHeaderSize + outputChunkSize]byte) }}
)

// outputBuffer is what a workload's output is read into, after frameHeaderSize bytes of room
// for a frame header. It starts small and takes a large buffer while reads fill the small
// one, giving it back once they no longer do: a flood of output moves in large frames (fewer
// writes and wake-ups per byte), while an idle or interactive stream, blocked in a read most
// of the time, holds little memory. Both come from pools shared by all streams.
type outputBuffer struct {
	small *[frameHeaderSize + chunkSize]byte
	large *[frameHeaderSize + outputChunkSize]byte
}

// bytes is the buffer to read the next piece into, from its frameHeaderSize'th byte.
func (b *outputBuffer) bytes() []byte {
	if b.large != nil {
		return b.large[:]
	}
	if b.small == nil {
		b.small = smallBuffers.Get().(*[frameHeaderSize + chunkSize]byte)
	}
	return b.small[:]
}

// used adapts the buffer to a read of n bytes into bytes().
func (b *outputBuffer) used(n int) {
	switch {
	case b.large == nil && n == chunkSize:
		b.large = largeBuffers.Get().(*[frameHeaderSize + outputChunkSize]byte)
	case b.large != nil && n < chunkSize:
		largeBuffers.Put(b.large)
		b.large = nil
	}
}

// release gives the buffers back.
func (b *outputBuffer) release() {
	if b.large != nil {
		largeBuffers.Put(b.large)
		b.large = nil
	}
	if b.small != nil {
		smallBuffers.Put(b.small)
		b.small = nil
	}
}
