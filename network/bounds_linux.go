//go:build linux

package network

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The bounds of what a sandbox can make its resolver hold (issue 37): root in a sandbox opened
// ~17 000 TCP connections to its resolver, and sent queries the upstream never answered, each
// holding a socket for the upstream timeout, until bothyd ran out of descriptors. Each bound
// holds per sandbox and, well below bothyd's descriptor limit, for all sandboxes together, so
// that one sandbox cannot take the whole of it and all of them cannot take the server's.
// Past a bound a TCP connection is closed as soon as it is accepted, and a query is answered
// SERVFAIL at once without going upstream.
const (
	// maxConnsPerSandbox and maxConns bound the open TCP connections to the resolvers.
	maxConnsPerSandbox = 16
	maxConns           = 256
	// maxPendingPerSandbox and maxPending bound the queries forwarded upstream and not yet
	// answered; each holds one socket to the upstream.
	maxPendingPerSandbox = 32
	maxPending           = 256
	// maxPinsPerSandbox bounds the addresses pinned for a sandbox at a time: each is an
	// element of its nftables set, kernel memory, and a zone the policy allows answers as
	// many distinct addresses, for as long (up to maxPinTTL), as its owner likes.
	maxPinsPerSandbox = 4096

	// A TCP connection must bring a whole first query within resolverReadTimeout of its
	// accept, and each later one within resolverIdleTimeout of the last answer; an answer
	// must be taken within resolverWriteTimeout; and the connection ends resolverConnLife
	// after its accept, whatever it does (at most 128 queries go over one, miekg/dns's
	// default).
	resolverReadTimeout  = 2 * time.Second
	resolverIdleTimeout  = 8 * time.Second
	resolverWriteTimeout = 2 * time.Second
	resolverConnLife     = 30 * time.Second
)

// limits are the bounds a Manager applies; the tests lower them.
type limits struct {
	connsPerSandbox, conns, pendingPerSandbox, pending int64
	pinsPerSandbox                                     int
}

var defaultLimits = limits{maxConnsPerSandbox, maxConns, maxPendingPerSandbox, maxPending, maxPinsPerSandbox}

// gate counts the holders of a resource against its bound.
type gate struct {
	n   atomic.Int64
	max int64
}

// enterAll takes a place in each gate, or in none when one is full.
func enterAll(gates ...*gate) bool {
	for i, g := range gates {
		if g.n.Add(1) > g.max {
			for _, h := range gates[:i+1] {
				h.n.Add(-1)
			}
			return false
		}
	}
	return true
}

func leaveAll(gates ...*gate) {
	for _, g := range gates {
		g.n.Add(-1)
	}
}

// boundedListener accepts a connection only while its gates have room, and closes the others
// at once: the accept loop keeps draining the kernel's queue, so connections past the bound
// hold neither a descriptor nor a place in the backlog for long.
type boundedListener struct {
	net.Listener
	gates []*gate
	// full is called for each connection closed at the bound; failed for each accept that
	// failed for want of descriptors or memory. They must not block.
	full   func()
	failed func(error)
}

// Accept returns the next connection within the bounds. A failure for want of descriptors or
// memory is waited out here, with a growing pause, rather than returned: miekg/dns's loop
// retries such "temporary" errors at once, which would spin a core while bothyd is short of
// descriptors.
func (l *boundedListener) Accept() (net.Conn, error) {
	var pause time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !short(err) {
				return nil, err
			}
			l.failed(err)
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			time.Sleep(pause)
			continue
		}
		pause = 0
		if !enterAll(l.gates...) {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, so that no TIME_WAIT is left either
			}
			c.Close()
			l.full()
			continue
		}
		now := time.Now()
		bc := &boundedConn{Conn: c, end: now.Add(resolverConnLife), gates: l.gates}
		_ = c.SetReadDeadline(now.Add(resolverReadTimeout))
		return bc, nil
	}
}

// short reports whether an accept failed for want of descriptors or memory.
func short(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// boundedConn is an accepted connection that gives its place back when closed, whose reads
// never wait past its end of life, and whose writes wait at most resolverWriteTimeout (the
// DNS server sets no write deadline of its own, so a client that never reads would hold a
// blocked write for ever).
type boundedConn struct {
	net.Conn
	end   time.Time
	gates []*gate
	once  sync.Once
}

func (c *boundedConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() || t.After(c.end) {
		t = c.end
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *boundedConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *boundedConn) Write(b []byte) (int, error) {
	d := time.Now().Add(resolverWriteTimeout)
	if d.After(c.end) {
		d = c.end
	}
	_ = c.SetWriteDeadline(d)
	return c.Conn.Write(b)
}

func (c *boundedConn) Close() error {
	c.once.Do(func() { leaveAll(c.gates...) })
	return c.Conn.Close()
}

// The resolvers' log lines that a sandbox can cause go out at most once per logEvery for each
// sandbox and kind of line, and for at most maxLogKeys sandboxes and kinds at a time
// (internal/ratelog/perkey).
const (
	logEvery   = 10 * time.Second
	maxLogKeys = 1024
)
