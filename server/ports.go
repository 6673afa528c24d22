package server

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
)

// PortRoutes are the routes to sandboxes' own services (issue 16): the HTTP proxy, the TCP
// tunnel and the links' proxy. Nil ones answer 501 not-implemented.
type PortRoutes struct {
	// Proxy serves /v1/sandboxes/{id}/ports/{port}/{path...}, every method.
	Proxy HandlerFunc
	// Tunnel serves GET /v1/sandboxes/{id}/ports/{port}/tcp, a websocket.
	Tunnel HandlerFunc
	// Link serves /p/{token}/{path...}, every method, without the API token.
	Link HandlerFunc
}

// portRoutes mounts the port routes. The proxies are validated against the contract for their
// path parameters and methods alone: their query, body and headers are the service's,
// whatever it takes. Their bodies are
// bounded as file uploads are (a service may take large ones), and the API token, which the
// proxy never passes on, comes in the Authorization header alone (see authenticatePort). A
// link's route is open: the link is its credential, checked by its handler. Each proxied
// request, tunnel and link request counts against its client's streams.
func (s *Server) portRoutes(r chi.Router, cfg Config) {
	r.Group(func(r chi.Router) {
		r.Use(s.authenticatePort, s.limitBody(cfg.MaxFileBytes), s.validate, s.boundStreams(nil))
		r.Handle("/v1/sandboxes/{id}/ports/{port}", s.handle(cfg.Ports.Proxy))
		r.Handle("/v1/sandboxes/{id}/ports/{port}/*", s.handle(cfg.Ports.Proxy))
	})
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate(true), s.validate, s.boundStreams(nil))
		r.Get("/v1/sandboxes/{id}/ports/{port}/tcp", s.handle(cfg.Ports.Tunnel))
	})
	r.Group(func(r chi.Router) {
		r.Use(s.limitBody(cfg.MaxFileBytes), s.validate, s.boundStreams(nil))
		r.Handle("/p/{token}", s.handle(cfg.Ports.Link))
		r.Handle("/p/{token}/*", s.handle(cfg.Ports.Link))
	})
}

// authenticatePort authenticates a port proxy's request by its Authorization header alone.
// The access_token parameter is not taken there (issue 37): a page opened with the token in
// its URL could read it, and send it on in Referer. A browser opens a port through a link
// (/p/{token}/), which reaches that port alone.
func (s *Server) authenticatePort(next http.Handler) http.Handler {
	return s.authenticateSaying(false,
		"This port needs the API token in 'Authorization: Bearer <token>'; a browser opens a port through a link (POST /v1/sandboxes/{id}/ports/{port}/links), never with the token in its URL.")(next)
}

// isPortProxyPath reports whether path is served by a port proxy (not the tunnel, not the
// links' API): requests there belong to the sandbox's service, which decides what a foreign
// Origin may do, and whose uploads may be large and slow.
func isPortProxyPath(path string) bool {
	if strings.HasPrefix(path, "/p/") {
		return true
	}
	tail, ok := strings.CutPrefix(path, "/v1/sandboxes/")
	if !ok {
		return false
	}
	_, tail, ok = strings.Cut(tail, "/")
	if !ok {
		return false
	}
	tail, ok = strings.CutPrefix(tail, "ports/")
	if !ok {
		return false
	}
	_, rest, _ := strings.Cut(tail, "/")
	return rest != "tcp" && rest != "links" && !strings.HasPrefix(rest, "links/")
}

// isPortProxyRequest is isPortProxyPath for a request.
func isPortProxyRequest(r *http.Request) bool { return isPortProxyPath(r.URL.Path) }
