// Package portmux carries many byte-stream sessions over one byte stream: the virtio-serial
// port between a microVM's shim on the host and its guest init. A port is a single stream that
// lives as long as the VM, with no notion of a connection, so the control protocol's sessions
// (one per connection of the supervisor to the control socket) are framed on it explicitly:
// the host opens a session, data flows both ways tagged with its number, and either side
// closes it. A connection's end is thus never inferred from the port's state, and bytes of an
// old session can never be read as a new one's.
//
// Frames are a 9-byte header (type, session number, payload length, big-endian) and at most
// [MaxPayload] bytes of payload. Each side bounds what it buffers for a session that its
// reader does not drain ([MaxBuffered]) by dropping that session, so a peer cannot make the
// other side hold unbounded memory; yamux's stream windows keep honest sessions far below it.
// The package imports nothing of bothyd: it runs in the guest and in the shim.
package portmux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Frame types.
const (
	// FrameReady (guest to host, session 0) says the guest init has the port open.
	FrameReady byte = 1
	// FrameConfig (host to guest, session 0) carries the launch's configuration, which never
	// lies in a file the guest can read.
	FrameConfig byte = 2
	// FrameListening (guest to host, session 0) says the agent accepts sessions.
	FrameListening byte = 3
	// FrameOpen (host to guest) opens a session.
	FrameOpen byte = 4
	// FrameData carries a session's bytes, either way.
	FrameData byte = 5
	// FrameClose ends a session, either way: its sender sends and reads nothing more of it.
	FrameClose byte = 6
	// FrameShutdown (host to guest, session 0) asks the guest to end the sandbox gracefully,
	// as a TERM to the agent does.
	FrameShutdown byte = 7
	// FrameRestore (host to guest, session 0) carries what a guest restored from a memory
	// state needs to become this launch's: the launch's capability, host name, fresh
	// entropy and machine id, and how far to advance its clock. It arrives on the port that
	// was idle when the state was saved, which thus carries no half-sent frame of before.
	FrameRestore byte = 8
	// FrameClock (host to guest, session 0) carries a duration (int64 nanoseconds, big-endian)
	// to add to the guest's clock: the time the VM lay stopped, during which its clock stood.
	FrameClock byte = 9
)

// MaxPayload bounds one frame's payload; MaxBuffered what one side holds for a session its
// reader does not drain before it drops the session.
const (
	MaxPayload  = 64 << 10
	MaxBuffered = 64 << 20
	headerSize  = 9
)

// ErrFrame is a frame that breaks the format: the stream can no longer be trusted.
var ErrFrame = errors.New("portmux: malformed frame")

// ReadFrame reads one frame from r into buf (at least MaxPayload long) and returns its type,
// session and payload (a slice of buf).
func ReadFrame(r io.Reader, buf []byte) (typ byte, session uint32, payload []byte, err error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[5:])
	if n > MaxPayload || h[0] < FrameReady || h[0] > FrameClock {
		return 0, 0, nil, fmt.Errorf("%w: type %d, length %d", ErrFrame, h[0], n)
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return 0, 0, nil, err
	}
	return h[0], binary.BigEndian.Uint32(h[1:5]), buf[:n], nil
}

// Writer writes whole frames to the stream, one at a time.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
	// failed is the first write error: the stream is broken after it.
	failed error
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// WriteFrame writes one frame; payload longer than MaxPayload is split into several frames of
// the same type.
func (w *Writer) WriteFrame(typ byte, session uint32, payload []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if w.failed != nil {
			return w.failed
		}
		n := min(len(payload), MaxPayload)
		frame := make([]byte, headerSize+n)
		frame[0] = typ
		binary.BigEndian.PutUint32(frame[1:5], session)
		binary.BigEndian.PutUint32(frame[5:9], uint32(n))
		copy(frame[headerSize:], payload[:n])
		if _, err := w.w.Write(frame); err != nil {
			w.failed = err
			return err
		}
		payload = payload[n:]
		if len(payload) == 0 {
			return nil
		}
	}
}

// Conn is one session as a net.Conn. Its deadlines are not supported (they are no-ops): the
// control protocol runs yamux over it, which keeps its own timers.
type Conn struct {
	id     uint32
	w      *Writer
	onDone func(*Conn)

	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	eof    bool // the peer closed the session, or the port went away
	closed bool // this side closed it
	err    error
}

// NewConn returns the session id that writes its frames through w; onDone, if set, runs once
// when this side closes it.
func NewConn(id uint32, w *Writer, onDone func(*Conn)) *Conn {
	c := &Conn{id: id, w: w, onDone: onDone}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// ID is the session's number.
func (c *Conn) ID() uint32 { return c.id }

// Deliver queues bytes that arrived for the session. It reports false when the session holds
// more than MaxBuffered undrained: the caller then drops it (Close).
func (c *Conn) Deliver(p []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.eof {
		return true
	}
	if len(c.buf)+len(p) > MaxBuffered {
		return false
	}
	c.buf = append(c.buf, p...)
	c.cond.Broadcast()
	return true
}

// Hangup marks the session as ended by the peer (or by the port's end, with err): reads drain
// what is queued and then return io.EOF (or err).
func (c *Conn) Hangup(err error) {
	c.mu.Lock()
	c.eof = true
	if c.err == nil {
		c.err = err
	}
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Read implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) == 0 && !c.eof && !c.closed {
		c.cond.Wait()
	}
	if c.closed {
		return 0, net.ErrClosed
	}
	if len(c.buf) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		return 0, io.EOF
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	if len(c.buf) == 0 {
		c.buf = nil // give the memory back once drained
	}
	return n, nil
}

// Write implements net.Conn.
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	done := c.closed || c.eof
	c.mu.Unlock()
	if done {
		return 0, net.ErrClosed
	}
	if err := c.w.WriteFrame(FrameData, c.id, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Close ends the session: the peer is told unless it closed it first.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	peerGone := c.eof
	c.buf = nil
	c.cond.Broadcast()
	c.mu.Unlock()
	var err error
	if !peerGone {
		err = c.w.WriteFrame(FrameClose, c.id, nil)
	}
	if c.onDone != nil {
		c.onDone(c)
	}
	return err
}

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return Addr(c.id) }

// RemoteAddr implements net.Conn.
func (c *Conn) RemoteAddr() net.Addr { return Addr(c.id) }

// SetDeadline implements net.Conn as a no-op.
func (c *Conn) SetDeadline(time.Time) error { return nil }

// SetReadDeadline implements net.Conn as a no-op.
func (c *Conn) SetReadDeadline(time.Time) error { return nil }

// SetWriteDeadline implements net.Conn as a no-op.
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }

// Addr names a session.
type Addr uint32

// Network implements net.Addr.
func (Addr) Network() string { return "portmux" }

func (a Addr) String() string { return fmt.Sprintf("session-%d", uint32(a)) }

// Table is the live sessions of one side, by number.
type Table struct {
	mu       sync.Mutex
	sessions map[uint32]*Conn
	closed   error
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{sessions: map[uint32]*Conn{}} }

// Add registers c; it fails once the table is shut (Shut).
func (t *Table) Add(c *Conn) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed != nil {
		return t.closed
	}
	if _, dup := t.sessions[c.id]; dup {
		return fmt.Errorf("%w: session %d opened twice", ErrFrame, c.id)
	}
	t.sessions[c.id] = c
	return nil
}

// Get returns the session id, if it is live.
func (t *Table) Get(id uint32) *Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sessions[id]
}

// Remove forgets c (if it is still the session of its number).
func (t *Table) Remove(c *Conn) {
	t.mu.Lock()
	if t.sessions[c.id] == c {
		delete(t.sessions, c.id)
	}
	t.mu.Unlock()
}

// Shut ends every session with err and refuses new ones.
func (t *Table) Shut(err error) {
	t.mu.Lock()
	t.closed = err
	all := t.sessions
	t.sessions = map[uint32]*Conn{}
	t.mu.Unlock()
	for _, c := range all {
		c.Hangup(err)
	}
}

// Dispatch applies a session frame (FrameData or FrameClose) that arrived; a session that
// overflows its buffer is dropped (closed, the peer told).
func (t *Table) Dispatch(typ byte, id uint32, payload []byte) {
	c := t.Get(id)
	if c == nil {
		return // a session this side already closed: its late frames are dropped
	}
	switch typ {
	case FrameData:
		if !c.Deliver(payload) {
			c.Close()
		}
	case FrameClose:
		t.Remove(c)
		c.Hangup(nil)
	}
}
