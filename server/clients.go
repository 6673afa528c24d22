package server

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/internal/forwarded"
)

// Bounds on what one client, and all clients together, hold open (issue 37). A client is a
// remote address (its IP): behind a reverse proxy every client is the proxy's one, and the
// per-client bounds are then the proxy's share, except behind the cluster router, which
// names each request's client with proof that it holds the token (requestClient): there the
// stream bounds are each client's, and only the connection bounds the router's. Each is well below the descriptors the
// server has (cmd/bothyd raises RLIMIT_NOFILE to its hard limit and lowers MaxConns to a
// quarter of it if that is less), so that a flood from one client leaves /healthz and every
// other client answered.
const (
	// DefaultMaxConns bounds the connections the listener holds open at once, all clients
	// together; one past it is answered 429 and closed.
	DefaultMaxConns = 4096
	// DefaultMaxConnsPerClient bounds one client's open connections.
	DefaultMaxConnsPerClient = 256
	// MaxStreamsPerClient bounds one client's long-lived requests at once: event streams,
	// exec streams, port tunnels, port proxy requests and E2B's streams and watches.
	MaxStreamsPerClient = 32
	// MaxStreams bounds them for all clients together.
	MaxStreams = 1024
	// refusalLinger bounds how long a refused connection is kept to read what its client
	// sent, so that the close does not reset the connection before the 429 arrives.
	refusalLinger = time.Second
	// maxRefusing bounds the refused connections lingering at once; past it, a refused
	// connection is closed without an answer.
	maxRefusing = 64
)

// clientOf is the client a request comes from: its remote IP.
func clientOf(remoteAddr string) string {
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return h
	}
	return remoteAddr
}

// requestClient is the client a request counts for: its remote IP, or the client a proxy
// holding this server's token names for it (the cluster router, internal/forwarded), counted
// apart from that proxy's other clients and from the same address calling directly.
func (s *Server) requestClient(r *http.Request) string {
	if c, ok := forwarded.Client(r.Header, s.token); ok {
		return c + " via " + clientOf(r.RemoteAddr)
	}
	return clientOf(r.RemoteAddr)
}

// counter counts what each client, and all of them, hold, against two bounds.
type counter struct {
	per, total int

	mu       sync.Mutex
	byClient map[string]int
	all      int
}

// take counts one for client, or reports false when it, or everyone, holds the most.
func (c *counter) take(client string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byClient[client] >= c.per || c.all >= c.total {
		return false
	}
	if c.byClient == nil {
		c.byClient = map[string]int{}
	}
	c.byClient[client]++
	c.all++
	return true
}

func (c *counter) release(client string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all--
	if c.byClient[client]--; c.byClient[client] <= 0 {
		delete(c.byClient, client)
	}
}

// boundStreams counts the requests isStream says are long-lived against the client's and
// the server's stream bounds, refusing one past them with 429 limit-reached.
func (s *Server) boundStreams(isStream func(*http.Request) bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if isStream != nil && !isStream(r) {
				next.ServeHTTP(w, r)
				return
			}
			client := s.requestClient(r)
			if !s.streams.take(client) {
				s.writeProblem(w, r, errcode.New(errcode.LimitReached,
					"This client has %d streams, tunnels and proxied requests open, the most one client may (or the server has %d); close one, or retry shortly.",
					MaxStreamsPerClient, MaxStreams))
				return
			}
			defer s.streams.release(client)
			next.ServeHTTP(w, r)
		})
	}
}

// answerWithoutBody makes an error answer of h (a foreign handler, which writes its own
// errors) not wait for a request body its client has not sent, as bothyd's own refusals do
// (see [abandonBody]): the answer goes at once and the connection closes.
func (s *Server) answerWithoutBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&abandoningWriter{ResponseWriter: w, r: r}, r)
	})
}

// abandoningWriter abandons the unread body of r when the answer is an error.
type abandoningWriter struct {
	http.ResponseWriter
	r     *http.Request
	wrote bool
}

func (a *abandoningWriter) WriteHeader(code int) {
	if !a.wrote {
		a.wrote = true
		if code >= 400 && abandonBody(a.r) {
			a.Header().Set("Connection", "close")
		}
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *abandoningWriter) Write(p []byte) (int, error) {
	if !a.wrote {
		a.WriteHeader(http.StatusOK)
	}
	return a.ResponseWriter.Write(p)
}

func (a *abandoningWriter) Flush() { _ = http.NewResponseController(a.ResponseWriter).Flush() }

func (a *abandoningWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// limitListener bounds the connections of a listener per client and in all. A connection
// past a bound is answered 429 limit-reached and closed, holding its descriptor for at most
// refusalLinger.
type limitListener struct {
	net.Listener
	conns    *counter
	refusing chan struct{}
}

// LimitListener wraps ln with the connection bounds: at most total connections open at
// once, and perClient of them from one client.
func LimitListener(ln net.Listener, total, perClient int) net.Listener {
	return &limitListener{Listener: ln, conns: &counter{per: perClient, total: total}, refusing: make(chan struct{}, maxRefusing)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientOf(c.RemoteAddr().String())
		if l.conns.take(client) {
			return &countedConn{Conn: c, release: func() { l.conns.release(client) }}, nil
		}
		select {
		case l.refusing <- struct{}{}:
			go func() {
				defer func() { <-l.refusing }()
				refuseConn(c)
			}()
		default:
			c.Close()
		}
	}
}

// tooManyConns is the answer to a connection past the bounds.
var tooManyConns = func() []byte {
	body, _ := json.Marshal(problem{
		Type: "urn:bothyd:problem:" + string(errcode.LimitReached), Title: http.StatusText(http.StatusTooManyRequests),
		Status: http.StatusTooManyRequests, Code: string(errcode.LimitReached),
		Detail: "This client has as many connections open as one client may (or the server as many as it takes); close some, or retry shortly.",
	})
	body = append(body, '\n')
	head := "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/problem+json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n"
	return append([]byte(head), body...)
}()

// refuseConn answers c 429 and closes it after reading, for a moment, what its client sent.
func refuseConn(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refusalLinger))
	buf := make([]byte, 4096)
	_, _ = c.Read(buf) // the request's head, most often whole in one read
	_, _ = c.Write(tooManyConns)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// countedConn releases its count once, when closed.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// ReadFrom keeps the connection's own ReadFrom (sendfile and splice for a *net.TCPConn),
// which net/http uses when it copies a file to a response.
func (c *countedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
