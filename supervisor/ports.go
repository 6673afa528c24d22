package supervisor

import (
	"context"
	"net"
	"sync"

	"github.com/bothy/bothy/errcode"
)

// Bounds of port connections ([Supervisor.DialPort]). Each one holds a descriptor-free yamux
// stream here but, above, the client's socket and, in the agent, a socket in the sandbox:
// the bounds keep one sandbox (or all of them) from taking every descriptor the server has.
const (
	DefaultPortConnsPerSandbox = 256
	DefaultPortConnsTotal      = 2048
)

// PortLimits bound the port connections open at once. Zero values mean the defaults.
type PortLimits struct {
	PerSandbox int
	Total      int
}

func (l PortLimits) withDefaults() PortLimits {
	if l.PerSandbox <= 0 {
		l.PerSandbox = DefaultPortConnsPerSandbox
	}
	if l.Total <= 0 {
		l.Total = DefaultPortConnsTotal
	}
	return l
}

// portConns counts the open port connections, in all and per sandbox.
type portConns struct {
	limits PortLimits
	mu     sync.Mutex
	total  int
	per    map[string]int
}

func (p *portConns) acquire(id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.per == nil {
		p.per = map[string]int{}
	}
	if p.per[id] >= p.limits.PerSandbox {
		return errcode.New(errcode.LimitReached,
			"Sandbox %s already has %d port connections open, as many as this server allows one sandbox; close some and retry.", id, p.limits.PerSandbox)
	}
	if p.total >= p.limits.Total {
		return errcode.New(errcode.LimitReached,
			"This server already has %d port connections open, as many as it allows; retry once some have closed.", p.limits.Total)
	}
	p.per[id]++
	p.total++
	return nil
}

func (p *portConns) release(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total--
	if p.per[id]--; p.per[id] <= 0 {
		delete(p.per, id)
	}
}

// PortLimits are the bounds of port connections this supervisor applies.
func (s *Supervisor) PortLimits() PortLimits { return s.ports.limits }

// PortConns is the number of port connections open now, in all.
func (s *Supervisor) PortConns() int {
	s.ports.mu.Lock()
	defer s.ports.mu.Unlock()
	return s.ports.total
}

// DialPort connects to TCP port on 127.0.0.1 inside a running sandbox, through its agent:
// it works for a sandbox without any network. It takes no lock, the exec lock least of all,
// so a served app and an exec run side by side; a sandbox that stops ends its connections.
// ctx bounds the dial only. The connection counts against [PortLimits] until it is closed.
func (s *Supervisor) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	// A dial is a use of a moment. The requests through a connection are the uses that last
	// ([Supervisor.Use]): the port proxy keeps idle connections pooled, and a pooled
	// connection that nothing uses must not keep its sandbox awake.
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := s.ports.acquire(id); err != nil {
		return nil, err
	}
	conn, err := agent.DialPort(ctx, port)
	if err != nil {
		s.ports.release(id)
		if errcode.Of(err) == "" && ctx.Err() == nil {
			return nil, errcode.Wrap(errcode.Internal, err, "Connecting to port %d of sandbox %s failed.", port, id)
		}
		return nil, err
	}
	return &countedConn{Conn: conn, release: func() { s.ports.release(id) }}, nil
}

// countedConn gives its slot back once, at the first Close.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
