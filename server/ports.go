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

// portRoutes mounts the port routes. The proxies are not validated against the contract:
// their query, body and headers are the service's, whatever it takes. Their bodies are
// bounded as file uploads are (a service may take large ones), and the API token, which the
// proxy never passes on, may come as access_token for a browser. A link's route is open: the
// link is its credential, checked by its handler.
func (s *Server) portRoutes(r chi.Router, cfg Config) {
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate(true), s.limitBody(cfg.MaxFileBytes))
		r.Handle("/v1/sandboxes/{id}/ports/{port}", s.handle(cfg.Ports.Proxy))
		r.Handle("/v1/sandboxes/{id}/ports/{port}/*", s.handle(cfg.Ports.Proxy))
	})
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate(true), s.validate)
		r.Get("/v1/sandboxes/{id}/ports/{port}/tcp", s.handle(cfg.Ports.Tunnel))
	})
	r.Group(func(r chi.Router) {
		r.Use(s.limitBody(cfg.MaxFileBytes))
		r.Handle("/p/{token}", s.handle(cfg.Ports.Link))
		r.Handle("/p/{token}/*", s.handle(cfg.Ports.Link))
	})
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
