package router

import (
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/bothy/bothy/openapi"
)

// The dashboard (package web) and the contract (/openapi.yaml, and the reference at /docs
// rendered from it), served by the router as a single bothyd serves them, so that a cluster
// has one console: its calls come back to the router, which routes them as any client's.
// The page asks for the router's token (its form; a router prints no one-time login URL,
// having no console of its own to print it to).

// serveOpen answers the routes that need no token, and reports whether req was one.
func (rt *Router) serveOpen(w http.ResponseWriter, req *http.Request) bool {
	p := req.URL.Path
	page := p == "/" || p == "/docs" || strings.HasPrefix(p, "/assets/")
	if !page && p != "/openapi.yaml" {
		return false
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		methodNotAllowed(w, req, http.MethodGet)
		return true
	}
	switch {
	case p == "/openapi.yaml":
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(openapi.Spec)
	case rt.cfg.Dashboard == nil:
		problem(w, http.StatusNotFound, "not-found", "This router serves no dashboard; see /openapi.yaml for the API.")
	default:
		rt.cfg.Dashboard.ServeHTTP(w, req)
	}
	return true
}

// browserAllowed keeps web pages of other origins out, as a node does (package server's
// checkBrowser): a request a browser sends from a page carries its Origin, and only the
// router's own page (the dashboard) may call it. A tokenless router (loopback tests) answers
// only requests addressed to a loopback host, so that no DNS name rebound to 127.0.0.1 lets
// a foreign page in.
func (rt *Router) browserAllowed(w http.ResponseWriter, req *http.Request) bool {
	if rt.cfg.Token == "" && !loopbackHost(req.Host) {
		problem(w, http.StatusForbidden, "forbidden", "This router has no token and answers only requests addressed to a loopback host; use 127.0.0.1 or localhost, or give it a token.")
		return false
	}
	if origin := req.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, req.Host) {
			problem(w, http.StatusForbidden, "forbidden", "Requests from the origin "+quoteShort(origin)+" are not allowed; open the dashboard from this router.")
			return false
		}
	}
	return true
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func quoteShort(s string) string {
	if len(s) > 100 {
		s = s[:100]
	}
	return `"` + strings.ReplaceAll(s, `"`, `'`) + `"`
}
