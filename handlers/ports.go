package handlers

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/portlink"
	"github.com/bothy/bothy/supervisor"
)

// PortDialer is what the port routes need of the supervisor besides [Supervisor]:
// [supervisor.Supervisor] is one. It is apart so that fakes of Supervisor need not dial.
type PortDialer interface {
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
	PortLimits() supervisor.PortLimits
	// Use wakes a sleeping sandbox and records a use of it until end (supervisor's sleep.go).
	Use(ctx context.Context, id string) (end func(), err error)
}

var _ PortDialer = (*supervisor.Supervisor)(nil)

// PortsPrefix and LinksPrefix start the port routes' paths.
const (
	PortsPrefix = "/v1/sandboxes/"
	LinksPrefix = "/p/"
)

// splitPortPath splits /v1/sandboxes/{id}/ports/{port}{rest} (rest empty or from a slash).
func splitPortPath(p string) (id string, port int, rest string, ok bool) {
	tail, found := strings.CutPrefix(p, PortsPrefix)
	if !found {
		return "", 0, "", false
	}
	id, tail, found = strings.Cut(tail, "/")
	if !found {
		return "", 0, "", false
	}
	tail, found = strings.CutPrefix(tail, "ports/")
	if !found {
		return "", 0, "", false
	}
	portStr, rest, _ := strings.Cut(tail, "/")
	if rest != "" || strings.HasSuffix(tail, "/") {
		rest = "/" + rest
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 || portStr != strconv.Itoa(port) {
		return id, 0, rest, true // a route of ours with a bad port: say so
	}
	return id, port, rest, true
}

// portTarget is where a proxied request goes; it travels in the request's context to the
// transport's dial.
type portTarget struct {
	sandbox string
	port    int
}

type portTargetKey struct{}

// portProxy is the proxy the port routes share. Its transport pools connections per sandbox
// and port (the target is in the URL's host, which the pool keys on), so keep-alive works;
// idle pooled connections are few and short-lived, since each holds a port connection of
// the sandbox's share.
type portProxy struct {
	once  sync.Once
	proxy *httputil.ReverseProxy
}

// The proxy's pool of idle connections.
const (
	portIdlePerTarget = 4
	portIdleTimeout   = 30 * time.Second
)

// sandboxCSP makes a page the sandbox serves run in an opaque origin of its own: on this
// server's origin it could otherwise read the dashboard's token from localStorage and call
// the API with it. Scripts, forms and popups still work.
const sandboxCSP = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads allow-pointer-lock allow-presentation"

func (h *Handlers) portDialer() (PortDialer, error) {
	d, ok := h.sup.(PortDialer)
	if !ok {
		return nil, errcode.New(errcode.NotImplemented, "This server does not serve sandbox ports.")
	}
	return d, nil
}

func (h *Handlers) reverseProxy(d PortDialer) *httputil.ReverseProxy {
	h.ports.once.Do(func() {
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				t, ok := ctx.Value(portTargetKey{}).(portTarget)
				if !ok {
					return nil, errors.New("handlers: a port request without its target")
				}
				return d.DialPort(ctx, t.sandbox, t.port)
			},
			MaxIdleConnsPerHost:   portIdlePerTarget,
			IdleConnTimeout:       portIdleTimeout,
			ResponseHeaderTimeout: 0, // a service may take as long as it likes to answer
			ForceAttemptHTTP2:     false,
		}
		h.ports.proxy = &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				t := pr.In.Context().Value(portTargetKey{}).(portTarget)
				// The pool keys on the URL's host: one per sandbox and port.
				pr.Out.URL.Scheme = "http"
				pr.Out.URL.Host = t.sandbox + ".sandbox:" + strconv.Itoa(t.port)
				pr.Out.Host = "127.0.0.1:" + strconv.Itoa(t.port)
				pr.SetXForwarded()
			},
			Transport:     tr,
			FlushInterval: -1, // stream: a service's server-sent events arrive as sent
			ModifyResponse: func(resp *http.Response) error {
				resp.Header.Set("Content-Security-Policy", sandboxCSP)
				return nil
			},
			ErrorLog: nil,
		}
	})
	return h.ports.proxy
}

// PortProxy serves /v1/sandboxes/{id}/ports/{port}/{path...}: the request goes to
// 127.0.0.1:{port} inside the sandbox, through its agent, without the API's credentials.
func (h *Handlers) PortProxy(w http.ResponseWriter, r *http.Request) error {
	id, port, rest, ok := splitPortPath(r.URL.Path)
	if !ok {
		return errcode.New(errcode.NotFound, "There is no route %s; see /openapi.yaml for the API.", r.URL.Path)
	}
	if port == 0 {
		return errcode.Invalid("port", "The port must be a number between 1 and 65535.")
	}
	prefix := PortsPrefix + id + "/ports/" + strconv.Itoa(port)
	return h.proxyTo(w, r, id, port, prefix, rest)
}

// LinkProxy serves /p/{token}/{path...}: what PortProxy does, for the link's sandbox and
// port, with the link as the credential.
func (h *Handlers) LinkProxy(w http.ResponseWriter, r *http.Request) error {
	if h.cfg.Links == nil {
		return errcode.New(errcode.NotImplemented, "This server does not serve port links.")
	}
	tail := strings.TrimPrefix(r.URL.Path, LinksPrefix)
	token, rest, _ := strings.Cut(tail, "/")
	l, err := h.cfg.Links.Resolve(token)
	if err != nil {
		return err
	}
	st, err := h.sup.Status(l.Sandbox)
	if err != nil || !st.Config.CreatedAt.Equal(l.SandboxCreated) {
		// The sandbox is gone, or another of the same id took its place: the link died
		// with the one it was made for.
		return errcode.New(errcode.LinkNotFound, "This link does not exist, has expired or was revoked; ask for a new one.")
	}
	if !strings.Contains(tail, "/") {
		// Relative URLs in the service's pages resolve against the directory.
		u := *r.URL
		u.Path += "/"
		u.RawPath = ""
		// The same path with a slash added, on this server: no open redirect (gosec G710).
		http.Redirect(w, r, u.RequestURI(), http.StatusMovedPermanently) //nolint:gosec // see above
		return nil
	}
	return h.proxyTo(w, r, l.Sandbox, l.Port, LinksPrefix+token, "/"+rest)
}

func (h *Handlers) proxyTo(w http.ResponseWriter, r *http.Request, id string, port int, prefix, rest string) error {
	d, err := h.portDialer()
	if err != nil {
		return err
	}
	if rest == "" {
		rest = "/"
	}
	// A request is a use of its sandbox until it is answered, and wakes a sleeping one: the
	// pooled connection it may reuse reaches no dial.
	end, err := d.Use(r.Context(), id)
	if err != nil {
		return err
	}
	defer end()
	out := r.Clone(context.WithValue(r.Context(), portTargetKey{}, portTarget{sandbox: id, port: port}))
	stripCredentials(out)
	out.URL.Path = rest
	out.URL.RawPath = ""
	if r.URL.RawPath != "" {
		// Keep the client's escapes (%2F stays %2F) in what the service sees.
		if raw, ok := strings.CutPrefix(r.URL.EscapedPath(), escapedPrefix(prefix)); ok {
			if p, err := url.PathUnescape(raw); err == nil {
				out.URL.Path, out.URL.RawPath = p, raw
			}
		}
	}
	out.Header.Set("X-Forwarded-Prefix", prefix)
	var proxyErr error
	rp := *h.reverseProxy(d)
	rp.ErrorHandler = func(_ http.ResponseWriter, _ *http.Request, err error) { proxyErr = err }
	rp.ServeHTTP(w, out)
	if proxyErr == nil || errors.Is(proxyErr, context.Canceled) {
		return nil
	}
	if errcode.Of(proxyErr) == "" {
		return errcode.Wrap(errcode.PortUnreachable, proxyErr, "The service on port %d of sandbox %s did not answer the request: %s.", port, id, proxyErrText(proxyErr))
	}
	return proxyErr
}

func escapedPrefix(p string) string { return (&url.URL{Path: p}).EscapedPath() }

// proxyErrText says what went wrong between the proxy and the service, without internals.
func proxyErrText(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "it closed the connection before a whole answer"
	}
	return "its answer was not HTTP"
}

// stripCredentials removes the API's credentials from a request the service will see: the
// Authorization header and every access_token parameter, however its name is escaped
// (access%5Ftoken, access_token+, twice-escaped): the server does not take a token from a
// port URL, but one pasted there must still never reach the service. Other parameters are
// passed on as they came.
func stripCredentials(r *http.Request) {
	r.Header.Del("Authorization")
	r.Header.Del("Proxy-Authorization")
	if r.URL.RawQuery == "" {
		return
	}
	parts := strings.Split(r.URL.RawQuery, "&")
	kept := parts[:0]
	for _, p := range parts {
		name, _, _ := strings.Cut(p, "=")
		if !isTokenParam(name) {
			kept = append(kept, p)
		}
	}
	r.URL.RawQuery = strings.Join(kept, "&")
	r.URL.ForceQuery = false
}

// isTokenParam reports whether a raw query parameter's name, unescaped as many times as a
// service might, is access_token (in any case, with any spaces or semicolons around it). A
// name that does not unescape is taken for one too: no service can read it reliably.
func isTokenParam(raw string) bool {
	name := raw
	for range 4 {
		u, err := url.QueryUnescape(name)
		if err != nil {
			return strings.Contains(strings.ToLower(name), "access")
		}
		if u == name {
			break
		}
		name = u
	}
	name = strings.ToLower(strings.Trim(name, " \t;"))
	return name == "access_token" || strings.HasSuffix(name, ";access_token")
}

// PortTunnel serves GET /v1/sandboxes/{id}/ports/{port}/tcp: one TCP connection to the
// port, carried in binary websocket frames. The connection is made before the upgrade, so
// that a sandbox that is not running or a port nobody listens on is a problem response.
// After the upgrade, the service's close is a normal close frame, and the client's close (or
// its silence past pongWait) closes the connection to the service.
func (h *Handlers) PortTunnel(w http.ResponseWriter, r *http.Request) error {
	if !websocket.IsWebSocketUpgrade(r) {
		return errcode.Invalid("Upgrade", "This route is a websocket; connect with a websocket client (or bothy port-forward).")
	}
	id, port, _, ok := splitPortPath(r.URL.Path)
	if !ok || port == 0 {
		return errcode.Invalid("port", "The port must be a number between 1 and 65535.")
	}
	d, err := h.portDialer()
	if err != nil {
		return err
	}
	// The tunnel is a use of its sandbox for as long as it is open.
	end, err := d.Use(r.Context(), id)
	if err != nil {
		return err
	}
	defer end()
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	conn, err := d.DialPort(ctx, id, port)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close()
	var upgradeErr error
	upgrader := websocket.Upgrader{
		ReadBufferSize:  32 << 10,
		WriteBufferSize: 32 << 10,
		CheckOrigin:     func(*http.Request) bool { return true }, // the server checked Origin
		Error: func(_ http.ResponseWriter, _ *http.Request, _ int, reason error) {
			upgradeErr = errcode.Wrap(errcode.InvalidRequest, reason, "The websocket handshake failed: %v.", reason)
		},
	}
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		if upgradeErr != nil {
			return upgradeErr
		}
		return err
	}
	h.streams.add(ws)
	defer h.streams.remove(ws)
	defer ws.Close()
	tunnel(ws, conn)
	return nil
}

// tunnelChunk is the most one binary frame carries from the service.
const tunnelChunk = 64 << 10

// tunnel copies between ws and conn until either ends. One goroutine writes to ws (data and
// pings); the caller's goroutine reads ws into conn.
func tunnel(ws *websocket.Conn, conn net.Conn) {
	ws.SetReadLimit(maxMessageSize)
	_ = ws.SetReadDeadline(time.Now().Add(pongWait))
	ws.SetPongHandler(func(string) error { return ws.SetReadDeadline(time.Now().Add(pongWait)) })

	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		data := make(chan []byte)
		readErr := make(chan error, 1)
		go func() {
			for {
				buf := make([]byte, tunnelChunk)
				n, err := conn.Read(buf)
				if n > 0 {
					data <- buf[:n]
				}
				if err != nil {
					readErr <- err
					close(data)
					return
				}
			}
		}()
		ping := time.NewTicker(pingPeriod)
		defer ping.Stop()
		for {
			select {
			case b, ok := <-data:
				if !ok {
					// The service closed its end (or the connection failed): a normal
					// close, after everything it sent.
					reason := ""
					if err := <-readErr; !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
						reason = "the connection to the service failed"
					}
					_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, reason), time.Now().Add(writeWait))
					return
				}
				_ = ws.SetWriteDeadline(time.Now().Add(writeWait))
				if err := ws.WriteMessage(websocket.BinaryMessage, b); err != nil {
					conn.Close()
					for range data { //nolint:revive // drain the reader until it sees the close
					}
					return
				}
			case <-ping.C:
				if err := ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeWait)); err != nil {
					conn.Close()
					for range data { //nolint:revive // drain
					}
					return
				}
			}
		}
	}()
	for {
		typ, b, err := ws.ReadMessage()
		if err != nil {
			break
		}
		if typ != websocket.BinaryMessage {
			continue // text frames carry nothing in a tunnel
		}
		if _, err := conn.Write(b); err != nil {
			break
		}
	}
	// The client is gone (or the service stopped reading): end the service's connection,
	// which ends the writer.
	conn.Close()
	<-writerDone
}

// CreatePortLink makes a signed link to the port (see portlink).
func (h *Handlers) CreatePortLink(_ context.Context, req openapi.CreatePortLinkRequestObject) (openapi.CreatePortLinkResponseObject, error) {
	if h.cfg.Links == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server does not serve port links.")
	}
	st, err := h.sup.Status(req.ID)
	if err != nil {
		return nil, err
	}
	ttl := time.Duration(0)
	if req.Body != nil && req.Body.TTLS != nil {
		ttl = time.Duration(*req.Body.TTLS) * time.Second
	}
	l, token, err := h.cfg.Links.Create(req.ID, st.Config.CreatedAt, req.Port, ttl)
	if err != nil {
		return nil, err
	}
	h.log.Info("port link made", "link", l.String(), "expires_at", l.ExpiresAt)
	return openapi.CreatePortLink201JSONResponse{
		ID: l.ID, Sandbox: l.Sandbox, Port: l.Port, Token: token,
		Path:      LinksPrefix + token + "/",
		CreatedAt: l.CreatedAt, ExpiresAt: l.ExpiresAt,
	}, nil
}

// ListPortLinks lists the port's live links, without tokens.
func (h *Handlers) ListPortLinks(_ context.Context, req openapi.ListPortLinksRequestObject) (openapi.ListPortLinksResponseObject, error) {
	items, err := h.listLinks(req.ID, req.Port)
	if err != nil {
		return nil, err
	}
	return openapi.ListPortLinks200JSONResponse{Items: items}, nil
}

// ListSandboxLinks lists the live links of every port of the sandbox, without tokens.
func (h *Handlers) ListSandboxLinks(_ context.Context, req openapi.ListSandboxLinksRequestObject) (openapi.ListSandboxLinksResponseObject, error) {
	items, err := h.listLinks(req.ID, 0)
	if err != nil {
		return nil, err
	}
	return openapi.ListSandboxLinks200JSONResponse{Items: items}, nil
}

// listLinks lists the live links of the sandbox's port (every port for 0). A link's token is
// shown once, when it is made: the list carries ids and times alone, so reading it gives no
// one a way into the port.
func (h *Handlers) listLinks(id string, port int) ([]openapi.PortLinkInfo, error) {
	if h.cfg.Links == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server does not serve port links.")
	}
	st, err := h.sup.Status(id)
	if err != nil {
		return nil, err
	}
	links := h.cfg.Links.List(id, st.Config.CreatedAt, port)
	items := make([]openapi.PortLinkInfo, 0, len(links))
	for _, l := range links {
		items = append(items, openapi.PortLinkInfo{ID: l.ID, Sandbox: l.Sandbox, Port: l.Port, CreatedAt: l.CreatedAt, ExpiresAt: l.ExpiresAt})
	}
	return items, nil
}

// DeletePortLink revokes a link.
func (h *Handlers) DeletePortLink(_ context.Context, req openapi.DeletePortLinkRequestObject) (openapi.DeletePortLinkResponseObject, error) {
	if h.cfg.Links == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server does not serve port links.")
	}
	if err := h.cfg.Links.Revoke(req.ID, req.Port, req.Link); err != nil {
		return nil, err
	}
	h.log.Info("port link revoked", "sandbox", req.ID, "port", req.Port, "link", req.Link)
	return openapi.DeletePortLink204Response{}, nil
}

// portInfo fills /v1/info's port limits.
func (h *Handlers) portInfo(info *openapi.Info) {
	d, ok := h.sup.(PortDialer)
	if !ok {
		return
	}
	l := d.PortLimits()
	per, total, ttl := l.PerSandbox, l.Total, int(portlink.MaxTTL.Seconds())
	info.Limits.MaxPortConnectionsPerSandbox = &per
	info.Limits.MaxPortConnections = &total
	info.Limits.MaxPortLinkTTLSeconds = &ttl
}
