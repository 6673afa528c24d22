package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds of what a sandbox can open in the proxy (docs/security.md, "Bounds").
const (
	// DefaultMaxConns bounds a sandbox's connections through the proxy, spliced and
	// intercepted together; one past it is closed at once.
	DefaultMaxConns = 64
	// MaxHelloBytes bounds the bytes read to find a TLS ClientHello's server name.
	MaxHelloBytes = 16 << 10
	// MaxHeaderBytes bounds an intercepted request's headers, and a response's.
	MaxHeaderBytes = 64 << 10
	// helloTimeout bounds the wait for a ClientHello and for an interception's handshakes.
	helloTimeout = 10 * time.Second
	dialTimeout  = 10 * time.Second
	// idleTimeout closes an intercepted connection that carries no request for this long.
	idleTimeout = 2 * time.Minute
	// maxUpstreamPerSandbox bounds the upstream connections an interception pool holds.
	maxUpstreamPerSandbox = 16
	// minEchoedValue is the shortest value replaced back in answers: a shorter one would match
	// text of the answer that is not the value.
	minEchoedValue = 8
)

// Header is a header the proxy sets on every request to a bound host; "{value}" in Value
// stands for the secret's value.
type Header struct {
	Name, Value string
}

// Binding is one secret bound to hosts, for one sandbox.
type Binding struct {
	Secret string
	// Hosts are exact names or "*.example.org" (every name below it), lower case.
	Hosts []string
	// Placeholder is what the sandbox holds instead of the value.
	Placeholder string
	// Header, when set, is set on every request to a bound host.
	Header *Header
}

// covers reports whether the binding covers the host name (lower case, no final dot).
func (b Binding) covers(name string) bool {
	for _, h := range b.Hosts {
		if zone, ok := strings.CutPrefix(h, "*."); ok {
			if strings.HasSuffix(name, "."+zone) {
				return true
			}
		} else if name == h {
			return true
		}
	}
	return false
}

// Config configures a [Proxy].
type Config struct {
	// CA signs the leaf certificates shown to sandboxes.
	CA *CA
	// Value returns a secret's value at the time of a request (so a rotation takes effect at
	// the next one); false leaves its placeholder in place.
	Value func(name string) (string, bool)
	// Roots verify the upstream hosts' certificates; nil: the host's roots.
	Roots *x509.CertPool
	// OriginalDst returns where a redirected connection was going; nil: the kernel's
	// record of the redirection (SO_ORIGINAL_DST).
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// Dial makes upstream connections; nil: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxConns bounds each sandbox's connections; 0: DefaultMaxConns.
	MaxConns int
	Log      *slog.Logger
}

// Proxy is the egress proxy: it serves each sandbox whose policy binds a secret on a
// listener of that sandbox's ([Proxy.Serve]).
type Proxy struct {
	cfg Config
}

// New returns a proxy.
func New(cfg Config) *Proxy {
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: dialTimeout}
		cfg.Dial = d.DialContext
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Proxy{cfg: cfg}
}

// Sandbox is one sandbox's service in the proxy.
type Sandbox struct {
	p        *Proxy
	id       string
	ln       net.Listener
	bindings atomic.Pointer[[]Binding]
	sem      chan struct{}
	refused  atomic.Uint64

	allowed     func(netip.AddrPort) bool
	intercepted *chanListener
	srv         *http.Server
	transport   *http.Transport
	wg          sync.WaitGroup
	closeOnce   sync.Once

	mu     sync.Mutex
	conns  map[*releasing]bool // the sandbox's connections, closed by Close
	closed bool
}

// Serve serves the connections that the sandbox id's filter redirects to ln, until
// [Sandbox.Close]. allowed says whether a connection's original destination is one the proxy
// may dial: one the sandbox's filter redirected, as the network Manager knows them; a
// connection to any other is closed, whatever it asks for.
func (p *Proxy) Serve(id string, ln net.Listener, bindings []Binding, allowed func(netip.AddrPort) bool) *Sandbox {
	s := &Sandbox{p: p, id: id, ln: ln, sem: make(chan struct{}, p.cfg.MaxConns), intercepted: newChanListener(ln.Addr()),
		allowed: allowed, conns: map[*releasing]bool{}}
	s.bindings.Store(&bindings)
	s.transport = &http.Transport{
		DialTLSContext:         s.dialUpstream,
		MaxConnsPerHost:        maxUpstreamPerSandbox,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: MaxHeaderBytes,
		DisableCompression:     true,
		ForceAttemptHTTP2:      false,
	}
	rp := &httputil.ReverseProxy{Rewrite: s.rewrite, Transport: s.transport, ModifyResponse: s.modifyResponse,
		ErrorHandler: s.upstreamError, ErrorLog: nil}
	s.srv = &http.Server{Handler: s.check(rp), MaxHeaderBytes: MaxHeaderBytes, ReadHeaderTimeout: helloTimeout,
		IdleTimeout: idleTimeout, ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if ic, ok := c.(*interception); ok {
				return context.WithValue(ctx, interceptionKey{}, ic)
			}
			return ctx
		}}
	s.srv.SetKeepAlivesEnabled(true)
	s.wg.Add(2)
	go func() { defer s.wg.Done(); _ = s.srv.Serve(s.intercepted) }()
	go func() { defer s.wg.Done(); s.accept() }()
	return s
}

// Update replaces the sandbox's bindings; connections made after it follow them.
func (s *Sandbox) Update(bindings []Binding) { s.bindings.Store(&bindings) }

// Refused counts the connections closed because the sandbox held as many as it may.
func (s *Sandbox) Refused() uint64 { return s.refused.Load() }

// Close stops serving the sandbox and closes its connections.
func (s *Sandbox) Close() error {
	var err error
	s.closeOnce.Do(func() {
		err = s.ln.Close()
		s.intercepted.Close()
		s.srv.Close()
		s.transport.CloseIdleConnections()
		// A spliced connection is no server's: it is closed here, or Close would wait for
		// the sandbox to end it.
		s.mu.Lock()
		s.closed = true
		for c := range s.conns {
			c.Conn.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return err
}

func (s *Sandbox) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		select {
		case s.sem <- struct{}{}:
		default:
			s.refused.Add(1)
			c.Close()
			continue
		}
		rc := &releasing{Conn: c}
		rc.release = func() {
			s.mu.Lock()
			delete(s.conns, rc)
			s.mu.Unlock()
			<-s.sem
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			<-s.sem
			return
		}
		s.conns[rc] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(rc)
		}()
	}
}

// releasing gives back the connection's place when it closes, once.
type releasing struct {
	net.Conn
	once    sync.Once
	release func()
}

func (r *releasing) Close() error {
	r.once.Do(r.release)
	return r.Conn.Close()
}

// bound returns the bindings that cover name.
func (s *Sandbox) bound(name string) []Binding {
	var out []Binding
	for _, b := range *s.bindings.Load() {
		if b.covers(name) {
			out = append(out, b)
		}
	}
	return out
}

// handle reads the ClientHello's server name and intercepts the connection if a binding
// covers it; otherwise, or if it is no TLS at all, splices it untouched to where it was going.
func (s *Sandbox) handle(c net.Conn) {
	dst, err := s.p.cfg.OriginalDst(c)
	if err == nil && !s.allowed(dst) {
		err = fmt.Errorf("%s is not a destination the sandbox's filter sent here", dst)
	}
	if err != nil {
		// A connection straight to the listener (its original destination is the listener
		// itself), or to an address whose interception lapsed: never dialled.
		s.p.cfg.Log.Debug("egress: a connection closed without a destination", "sandbox", s.id, "err", err)
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	hello, sni := peekHello(c)
	_ = c.SetReadDeadline(time.Time{})
	name := strings.TrimSuffix(strings.ToLower(sni), ".")
	if name == "" || len(s.bound(name)) == 0 {
		s.splice(c, hello, dst)
		return
	}
	leaf, err := s.p.cfg.CA.Leaf(name)
	if err != nil {
		s.p.cfg.Log.Warn("egress: a leaf certificate could not be made", "sandbox", s.id, "host", name, "err", err)
		c.Close()
		return
	}
	tc := tls.Server(&prefixed{Conn: c, r: io.MultiReader(bytes.NewReader(hello), c)}, &tls.Config{
		Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
	err = tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		tc.Close()
		return
	}
	if !s.intercepted.push(&interception{Conn: tc, sni: name, dst: dst}) {
		tc.Close()
	}
}

// errPeeked ends the handshake that only read the ClientHello.
var errPeeked = errors.New("egress: the ClientHello was read")

// peekHello reads a TLS ClientHello from c, at most MaxHelloBytes, and returns the bytes read
// (to be replayed) and its server name ("" when there is none, or the bytes are no TLS).
func peekHello(c net.Conn) ([]byte, string) {
	var read bytes.Buffer
	sni := ""
	lim := &io.LimitedReader{R: c, N: MaxHelloBytes}
	_ = tls.Server(&peeking{Conn: c, r: io.TeeReader(lim, &read)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = h.ServerName
			return nil, errPeeked
		},
	}).HandshakeContext(context.Background()) // bounded by the caller's read deadline
	return read.Bytes(), sni
}

// peeking reads through r and writes nothing: the handshake that reads the ClientHello must
// not answer the client (an alert would end its connection).
type peeking struct {
	net.Conn
	r io.Reader
}

func (p *peeking) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *peeking) Write(b []byte) (int, error) { return len(b), nil }

// prefixed replays the bytes already read before the rest of the connection.
type prefixed struct {
	net.Conn
	r io.Reader
}

func (p *prefixed) Read(b []byte) (int, error) { return p.r.Read(b) }

// splice connects to dst, the destination the sandbox's filter allowed, and copies both ways
// untouched: the proxy sees no plaintext of a connection it does not intercept.
func (s *Sandbox) splice(c net.Conn, hello []byte, dst netip.AddrPort) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	up, err := s.p.cfg.Dial(ctx, "tcp", dst.String())
	cancel()
	if err != nil {
		return
	}
	defer up.Close()
	if _, err := up.Write(hello); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(to, from net.Conn) {
		_, _ = io.Copy(to, from)
		if cw, ok := to.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = to.Close()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(unwrap(c), up)
	<-done
	<-done
}

// unwrap returns the connection under a releasing wrapper, for CloseWrite.
func unwrap(c net.Conn) net.Conn {
	if r, ok := c.(*releasing); ok {
		return r.Conn
	}
	return c
}

// interception is an intercepted connection: the sandbox's side, decrypted, with where it
// was going.
type interception struct {
	net.Conn
	sni string
	dst netip.AddrPort
}

type interceptionKey struct{}

func interceptionOf(ctx context.Context) *interception {
	ic, _ := ctx.Value(interceptionKey{}).(*interception)
	return ic
}

// dialUpstream connects to the destination the sandbox's connection was going to (which its
// filter allowed), never to the address a Host header names, and verifies the host's
// certificate for the server name the sandbox asked for.
func (s *Sandbox) dialUpstream(ctx context.Context, _, _ string) (net.Conn, error) {
	ic := interceptionOf(ctx)
	if ic == nil {
		return nil, errors.New("egress: a request without its interception")
	}
	raw, err := s.p.cfg.Dial(ctx, "tcp", ic.dst.String())
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, &tls.Config{ServerName: ic.sni, RootCAs: s.p.cfg.Roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}

// check refuses a request whose Host is not the name the connection's TLS was for: the
// value goes only where both say.
func (s *Sandbox) check(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ic := interceptionOf(r.Context())
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.ToLower(host), ".")
		if ic == nil || host != ic.sni {
			http.Error(w, fmt.Sprintf("bothy egress: the request's Host %q is not the TLS server name; send one request per host name", r.Host), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// pairs returns the replacements of a request to name: each bound placeholder by its value,
// and the headers to set. A secret whose value is gone (deleted meanwhile) keeps its
// placeholder.
func (s *Sandbox) pairs(name string) (out, back []pair, headers []Header) {
	for _, b := range s.bound(name) {
		v, ok := s.p.cfg.Value(b.Secret)
		if !ok {
			continue
		}
		out = append(out, pair{Old: b.Placeholder, New: v})
		if len(v) >= minEchoedValue {
			back = append(back, pair{Old: v, New: b.Placeholder})
		}
		if b.Header != nil {
			headers = append(headers, Header{Name: b.Header.Name, Value: strings.ReplaceAll(b.Header.Value, "{value}", v)})
		}
	}
	return out, back, headers
}

type backKey struct{}

// rewrite makes the upstream request: to the intercepted name, placeholders replaced in the
// URL, the headers and the body (streamed), and the bound headers set.
func (s *Sandbox) rewrite(pr *httputil.ProxyRequest) {
	ic := interceptionOf(pr.In.Context())
	out, back, headers := s.pairs(ic.sni)
	o := pr.Out
	o.URL.Scheme, o.URL.Host, o.Host = "https", ic.sni, pr.In.Host
	o.URL.Path = replaceAll(o.URL.Path, out)
	o.URL.RawPath = replaceAll(o.URL.RawPath, out)
	o.URL.RawQuery = replaceAll(o.URL.RawQuery, out)
	for k, vs := range o.Header {
		for i, v := range vs {
			vs[i] = replaceAll(v, out)
		}
		o.Header[k] = vs
	}
	for _, h := range headers {
		o.Header.Set(h.Name, h.Value)
	}
	if o.Body != nil && o.Body != http.NoBody && len(out) > 0 {
		// The length changes with each replacement: the body goes chunked.
		o.Body = readCloser{Reader: newReplacer(o.Body, out), Closer: o.Body}
		o.ContentLength = -1
		o.Header.Del("Content-Length")
	}
	*o = *o.WithContext(context.WithValue(o.Context(), backKey{}, back))
}

// modifyResponse puts the placeholders back where an answer echoes a value, in its headers
// and body, so that a host that quotes the key in an error does not hand it to the sandbox.
// It cannot see through an encoding (gzip): that is a host's echo, not the proxy's leak.
func (s *Sandbox) modifyResponse(resp *http.Response) error {
	back, _ := resp.Request.Context().Value(backKey{}).([]pair)
	if len(back) == 0 {
		return nil
	}
	for k, vs := range resp.Header {
		for i, v := range vs {
			vs[i] = replaceAll(v, back)
		}
		resp.Header[k] = vs
	}
	if resp.Body != nil && resp.Body != http.NoBody && resp.Request.Method != http.MethodHead &&
		resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified {
		resp.Body = readCloser{Reader: newReplacer(resp.Body, back), Closer: resp.Body}
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
	}
	return nil
}

func (s *Sandbox) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	s.p.cfg.Log.Debug("egress: an upstream request failed", "sandbox", s.id, "err", err)
	http.Error(w, "bothy egress: the host could not be reached, or its certificate did not verify", http.StatusBadGateway)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// chanListener hands the http.Server the connections the proxy intercepted.
type chanListener struct {
	addr   net.Addr
	conns  chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }
