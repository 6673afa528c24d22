package control

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Descriptor passing ([FeatureStdoutPipe]) runs beside the yamux session, on the same unix
// socket: the sending end attaches descriptors to its next write of the connection
// (SCM_RIGHTS), whatever bytes that write carries, and the receiving end collects them as it
// reads. Both ends number the descriptors 1, 2, 3, ... in the order they travel, so a message
// names one by its number. The kernel delivers a descriptor with the first byte of the write
// it rode on, and the sender attaches it before it writes the message that names it, so the
// receiver holds it by the time it reads that message, unless more were queued than one write
// carries (then it comes with a later write, and the receiver waits for it).
//
// Only bothyd sends: a pipe it made, whose read end it keeps. The agent only receives, so
// nothing a sandbox sends can put a descriptor into bothyd.

// maxRightsPerWrite is how many descriptors one write carries: the kernel's SCM_MAX_FD.
const maxRightsPerWrite = 253

// maxUnclaimedFDs bounds the descriptors a receiver holds that no message claimed yet, far
// above the exec starts a connection has in flight. Past it the oldest is closed: it belongs
// to a request that never reached the agent (its stream failed after the descriptor left).
const maxUnclaimedFDs = 1024

// claimWait bounds how long a receiver waits for a descriptor a message names but that has
// not arrived (it is behind more than one write's worth of others).
const claimWait = 5 * time.Second

// fdSender is bothyd's end of a control connection over a unix socket: it passes the
// descriptors queued with send along with its writes.
type fdSender struct {
	*net.UnixConn
	// wmu keeps writes, and so the descriptors they take, in order. It is not held by send:
	// a write may wait for a peer that does not read, and an exec must not wait behind it.
	wmu     sync.Mutex
	mu      sync.Mutex // guards the fields below
	next    uint64     // the number of the next descriptor queued
	pending []*os.File // queued, in order, not yet written
	closed  bool
}

// send queues f to travel with the connection's next write, takes ownership of it (it is
// closed once written, or when the connection closes) and returns its number.
func (s *fdSender) send(f *os.File) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		f.Close()
		return 0, ErrClosed
	}
	s.next++
	s.pending = append(s.pending, f)
	return s.next, nil
}

// Write writes b with the queued descriptors (up to a write's worth) attached to its first
// byte. yamux's send loop is the only writer, but the lock keeps the order of descriptors
// and bytes whoever writes.
func (s *fdSender) Write(b []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	files := s.take()
	if len(files) == 0 || len(b) == 0 {
		s.requeue(files)
		return s.UnixConn.Write(b)
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	n, _, err := s.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	n = max(n, 0) // a failed sendmsg reports -1
	if n == 0 {
		s.requeue(files)
	} else {
		// The descriptors went with the first byte: the kernel holds them now.
		for _, f := range files {
			f.Close()
		}
	}
	if err != nil || n == len(b) {
		return n, err
	}
	// A stream socket may take part of a large write; the rest goes without descriptors.
	m, err := s.UnixConn.Write(b[n:])
	return n + m, err
}

// take removes the descriptors one write carries from the front of the queue.
func (s *fdSender) take() []*os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	files := slices.Clip(s.pending[:min(len(s.pending), maxRightsPerWrite)])
	s.pending = s.pending[len(files):]
	return files
}

// requeue puts back at the front of the queue the descriptors that a write took but did not
// carry; after the connection closed it closes them instead.
func (s *fdSender) requeue(files []*os.File) {
	if len(files) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		for _, f := range files {
			f.Close()
		}
		return
	}
	s.pending = append(files, s.pending...)
}

// Close closes the connection and the descriptors that never left.
func (s *fdSender) Close() error {
	s.mu.Lock()
	s.closed = true
	for _, f := range s.pending {
		f.Close()
	}
	s.pending = nil
	s.mu.Unlock()
	return s.UnixConn.Close()
}

// fdReceiver is the agent's end of a control connection over a unix socket: it collects the
// descriptors that arrive with the bytes it reads, for claim.
type fdReceiver struct {
	*net.UnixConn
	oob []byte // one read's control messages; only yamux's receive loop reads

	mu        sync.Mutex
	cond      *sync.Cond
	received  uint64              // how many descriptors arrived
	unclaimed map[uint64]*os.File // arrived and not claimed
	err       error               // why no more will arrive
}

func newFDReceiver(c *net.UnixConn) *fdReceiver {
	r := &fdReceiver{UnixConn: c, oob: make([]byte, unix.CmsgSpace(maxRightsPerWrite*4)), unclaimed: map[uint64]*os.File{}}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// errRights is the end of a connection whose descriptors cannot be numbered any more: some
// were cut off.
var errRights = errors.New("control: the connection's passed descriptors are out of step")

func (r *fdReceiver) Read(b []byte) (int, error) {
	n, oobn, flags, _, err := r.ReadMsgUnix(b, r.oob)
	n = max(n, 0) // a failed recvmsg reports -1
	if oobn > 0 {
		if rerr := r.collect(r.oob[:oobn], flags); rerr != nil {
			r.fail(rerr)
			return 0, rerr
		}
	}
	if err != nil {
		r.fail(err)
	}
	return n, err
}

// collect numbers the descriptors of one read's control messages. A truncated message lost
// some (the kernel closed those that did not fit), so every later number would be wrong.
func (r *fdReceiver) collect(oob []byte, flags int) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	var fds []int
	for _, m := range msgs {
		got, ferr := unix.ParseUnixRights(&m)
		if ferr == nil {
			fds = append(fds, got...)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.cond.Broadcast()
	for _, fd := range fds {
		r.received++
		r.unclaimed[r.received] = os.NewFile(uintptr(fd), fmt.Sprintf("passed descriptor %d", r.received))
	}
	if err != nil || flags&unix.MSG_CTRUNC != 0 {
		return errRights
	}
	for len(r.unclaimed) > maxUnclaimedFDs {
		oldest := slices.Min(slices.Collect(maps.Keys(r.unclaimed)))
		r.unclaimed[oldest].Close()
		delete(r.unclaimed, oldest)
	}
	return nil
}

// fail records that no more descriptors will arrive and closes those not claimed.
func (r *fdReceiver) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
	for n, f := range r.unclaimed {
		f.Close()
		delete(r.unclaimed, n)
	}
	r.cond.Broadcast()
}

// claim returns descriptor number n once it arrived, or an error if it does not within
// claimWait or the connection ends first. Each number is claimed at most once.
func (r *fdReceiver) claim(n uint64) (*os.File, error) {
	timer := newCondTimer(r.cond, claimWait)
	defer timer.stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if f, ok := r.unclaimed[n]; ok {
			delete(r.unclaimed, n)
			return f, nil
		}
		switch {
		case n == 0 || n <= r.received:
			return nil, fmt.Errorf("control: descriptor %d was not passed or was claimed before", n)
		case r.err != nil:
			return nil, fmt.Errorf("control: descriptor %d did not arrive: %w", n, r.err)
		case timer.expired():
			return nil, fmt.Errorf("control: descriptor %d did not arrive in time", n)
		}
		r.cond.Wait()
	}
}

// Close closes the connection and the descriptors nobody claimed.
func (r *fdReceiver) Close() error {
	r.fail(ErrClosed)
	return r.UnixConn.Close()
}

// condTimer wakes the waiters of a condition once a time has passed, so that a wait on it can
// give up.
type condTimer struct {
	t     *time.Timer
	fired atomic.Bool
}

func newCondTimer(c *sync.Cond, d time.Duration) *condTimer {
	ct := &condTimer{}
	ct.t = time.AfterFunc(d, func() {
		ct.fired.Store(true)
		c.L.Lock()
		c.Broadcast()
		c.L.Unlock()
	})
	return ct
}

func (ct *condTimer) expired() bool { return ct.fired.Load() }
func (ct *condTimer) stop()         { ct.t.Stop() }

// senderConn wraps conn for passing descriptors when it is a unix socket (bothyd's end);
// receiverConn does so for the agent's end. Over anything else they return conn as it is.
func senderConn(conn io.ReadWriteCloser) (io.ReadWriteCloser, *fdSender) {
	if uc, ok := conn.(*net.UnixConn); ok {
		s := &fdSender{UnixConn: uc}
		return s, s
	}
	return conn, nil
}

func receiverConn(conn io.ReadWriteCloser) (io.ReadWriteCloser, *fdReceiver) {
	if uc, ok := conn.(*net.UnixConn); ok {
		r := newFDReceiver(uc)
		return r, r
	}
	return conn, nil
}
