package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// FeatureDial is announced by an agent whose Handler is also a [PortDialer]: it serves the
// dial operation. It is not among [RequiredFeatures], so that an agent without it still
// serves everything else; [Client.DialPort] refuses to use an agent that lacks it.
const FeatureDial = "dial"

// OpDial opens a TCP connection to a port of the sandbox's own loopback interface and carries
// its bytes (see the package doc).
const OpDial Op = "dial"

// CodePortRefused answers a dial that found nothing listening on the port (or no answer in
// time).
const CodePortRefused = "port-refused"

// DialTimeout bounds how long the agent tries to connect to a port before it answers
// port-refused: a loopback connect answers at once, so only a service whose accept queue is
// full takes this long.
const DialTimeout = 5 * time.Second

// DialRequest is the header of a dial stream: the TCP port on 127.0.0.1 inside the sandbox.
// The address is fixed: the operation reaches the sandbox's own services, never a network
// beyond it, whatever the sandbox's network policy.
type DialRequest struct {
	Port int `json:"port"`
}

// Validate checks that the port is a TCP port.
func (r *DialRequest) Validate() error {
	if r.Port < 1 || r.Port > 65535 {
		return invalidf("The port must be between 1 and 65535, not %d.", r.Port)
	}
	return nil
}

// PortDialer is what a [Handler] implements to serve dial: it connects to 127.0.0.1:port in
// the sandbox's network namespace. An error that is a [*RemoteError] is sent as it is (use
// [CodePortRefused] for nothing listening); others become internal.
type PortDialer interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// features lists what the agent behind h announces; fds is the connection's receiver of
// passed descriptors, nil unless it is a unix socket.
func features(h Handler, fds *fdReceiver) []string {
	f := []string{FeatureExec, FeatureTTY, FeatureFiles, FeatureShutdown, FeatureStats}
	if _, ok := h.(StdoutPipeUser); ok && fds != nil {
		f = append(f, FeatureStdoutPipe)
	}
	if _, ok := h.(PortDialer); ok {
		f = append(f, FeatureDial)
	}
	if _, ok := h.(DirWatcher); ok {
		f = append(f, FeatureWatch)
	}
	if _, ok := h.(ProcessTracker); ok {
		f = append(f, FeatureProcs)
	}
	if _, ok := h.(FileMetaServer); ok {
		f = append(f, FeatureFileMeta)
	}
	if _, ok := h.(NetworkConfigurer); ok {
		f = append(f, FeatureNetwork, FeatureNetworkDown)
	}
	return f
}

// serveDial answers a dial and then splices the stream and the connection until either side
// is done. The service's end of its output (a TCP FIN) is passed on as our half-close of the
// stream; the client's close of its side ends the connection to the service whole, since a
// client that closed has nobody left to read for.
func (s *server) serveDial(ctx context.Context, st *yamux.Stream, fw *frameWriter, req *DialRequest) {
	d, ok := s.h.(PortDialer)
	if !ok {
		writeError(fw, invalidf("This agent does not serve %s.", OpDial))
		return
	}
	dctx, stop := watchClientUntil(ctx, st)
	conn, err := d.DialPort(dctx, req.Port)
	if !stop() {
		// The client gave up while we dialled: nobody to answer.
		if conn != nil {
			conn.Close()
		}
		return
	}
	if err != nil {
		writeError(fw, err)
		return
	}
	defer conn.Close()
	if err := writeJSON(fw, FrameResult, struct{}{}); err != nil {
		return
	}
	// The session's end (the client is gone) ends both copies.
	unhook := context.AfterFunc(ctx, func() {
		conn.Close()
		st.SetDeadline(time.Now())
	})
	defer unhook()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(st, conn)
		st.Close() // our FIN: the service ended its output, or the connection failed
	}()
	_, _ = io.Copy(conn, st)
	// The client closed its side (or the stream failed): end the connection, which ends the
	// other copy.
	conn.Close()
	<-done
}

// watchClientUntil is watchClient for an operation whose stream carries data after its
// answer: it watches only until stop, which reports whether the client was still there.
// Before our answer the client sends nothing, so anything the watcher reads, a close
// included, means the client gave up.
func watchClientUntil(ctx context.Context, st *yamux.Stream) (context.Context, func() bool) {
	ctx, cancel := context.WithCancel(ctx)
	var gone bool
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		var b [1]byte
		if _, err := st.Read(b[:]); !errors.Is(err, yamux.ErrTimeout) {
			gone = true
			cancel()
		}
	}()
	return ctx, func() bool {
		// A deadline in the past wakes the watcher with a timeout, if nothing else did.
		st.SetReadDeadline(time.Now())
		<-watching
		st.SetReadDeadline(time.Time{})
		cancel()
		return !gone
	}
}

// DialPort connects to TCP port on 127.0.0.1 inside the sandbox, through the agent, and
// returns the connection: bytes written to it reach the service, and what the service sends
// is read from it. ctx bounds the dial only. Nothing listening is an error whose code is
// errcode.PortUnreachable. Closing the connection ends it on the service's side too; a
// service that ends its output reads as io.EOF.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if !slices.Contains(c.hello.Features, FeatureDial) {
		return nil, fmt.Errorf("control: the agent (%s) does not serve %s; restart the sandbox with this bothyd", c.hello.AgentVersion, OpDial)
	}
	req := &DialRequest{Port: port}
	if err := req.Validate(); err != nil {
		if re, ok := errors.AsType[*RemoteError](err); ok {
			return nil, re.Err()
		}
		return nil, err
	}
	st, t, p, err := c.openAnswered(ctx, Header{Op: OpDial, Dial: req})
	if err != nil {
		return nil, err
	}
	switch t {
	case FrameResult:
		var ok struct{}
		if err := json.Unmarshal(p, &ok); err != nil {
			st.Close()
			return nil, fmt.Errorf("control: malformed dial answer: %w", err)
		}
		return &portConn{Stream: st}, nil
	case FrameError:
		st.Close()
		return nil, decodeRemoteError(p)
	}
	st.Close()
	return nil, fmt.Errorf("control: unexpected %s frame answering dial", t)
}

// portConn is the client's end of a dial: the stream, whose Close is the end of the
// connection. Close also unblocks a Read that waits on the agent, as net.Conn's Close must.
type portConn struct {
	*yamux.Stream
	once sync.Once
}

func (c *portConn) Close() error {
	c.once.Do(func() {
		// The embedded stream's own Close and deadline, named: c.Close is this method.
		c.Stream.Close() //nolint:staticcheck // QF1008: see above
		// Reads still pending would wait for the agent's FIN; a closed net.Conn's reads
		// return at once.
		c.Stream.SetReadDeadline(time.Now()) //nolint:staticcheck // QF1008: see above
	})
	return nil
}
