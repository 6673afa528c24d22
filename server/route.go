package server

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/getkin/kin-openapi/routers"

	"github.com/bothy/bothy/errcode"
)

// The contract's route of a request is found once, for every request the listener serves but
// the foreign API's, before any route of the server's own table is chosen: a method the spec
// does not list on a path is answered 405 with the spec's Allow wherever the path is served
// (the port proxies and links included, whose handlers would otherwise take any method), and
// the validator then judges the request by that operation. The spec is the one source of
// both; the server's route table only dispatches.

type routeKey struct{}

// contractRoute is a request's operation of the contract and its path parameters.
type contractRoute struct {
	route  *routers.Route
	params map[string]string
}

// routeOf returns the contract's operation that matchContract found for r, or nil.
func routeOf(r *http.Request) *contractRoute {
	cr, _ := r.Context().Value(routeKey{}).(*contractRoute)
	return cr
}

// matchContract finds r's operation in the contract, answers 405 for a method the contract
// does not list on a path it describes, and passes everything else on (a path it does not
// describe is the route table's to answer: 404, or the dashboard's assets).
func (s *Server) matchContract(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cr, allowed := s.validator.find(r)
		if cr == nil && len(allowed) > 0 {
			// RFC 9110 §15.5.6: a 405 says which methods the resource does take.
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			s.writeProblem(w, r, errcode.New(errcode.MethodNotAllowed,
				"%s is not allowed on %s; use %s (see /openapi.yaml for the API).", truncateName(r.Method), r.URL.Path, strings.Join(allowed, " or ")))
			return
		}
		if cr != nil {
			r = r.WithContext(context.WithValue(r.Context(), routeKey{}, cr))
		}
		next.ServeHTTP(w, r)
	})
}

// find returns r's operation in the contract; or, when there is none for r's method, the
// methods the contract lists on r's path (none: the path is not the contract's).
func (v *validator) find(r *http.Request) (*contractRoute, []string) {
	if cr := v.findMethod(r, r.Method); cr != nil {
		return cr, nil
	}
	var allowed []string
	for _, m := range methods {
		if m != r.Method && v.findMethod(r, m) != nil {
			allowed = append(allowed, m)
		}
	}
	return nil, allowed
}

// findMethod returns the operation of method on r's path, or nil. The proxies' {path} stands
// for the rest of the path, slashes included, which OpenAPI cannot say of a parameter: it is
// cut off here, matched as one segment, and given back whole as the parameter's value. The
// names the server keeps directly under a port (tcp, links) are never a proxied path.
func (v *validator) findMethod(r *http.Request, method string) *contractRoute {
	path := r.URL.Path
	proxied, rest := proxiedRest(path)
	if proxied {
		path = strings.TrimSuffix(path, rest)
		if !strings.HasSuffix(path, "/") {
			path += "/"
		}
		path += "x"
	}
	req := &http.Request{Method: method, URL: &url.URL{Path: path}, Header: r.Header, Host: r.Host}
	route, params, err := v.router.FindRoute(req)
	if err != nil || strings.Count(route.Path, "/") != strings.Count(path, "/") {
		// kin-openapi's trie matches a parameter to nothing at the end of a path as well:
		// DELETE /v1/sandboxes is not DELETE /v1/sandboxes/{id} with an empty id.
		return nil
	}
	_, isProxy := route.Operation.Extensions["x-proxy"]
	if isProxy != proxied {
		// `…/ports/{port}/links` is the links, not a service's page.
		return nil
	}
	if proxied && rest != "" {
		// An empty rest (the service's root) keeps the stand-in: a required path
		// parameter cannot be empty in OpenAPI, though this one may.
		params["path"] = rest
	}
	return &contractRoute{route: route, params: params}
}

// proxiedRest reports whether path is served by a port proxy or a link, and the rest of it
// after the port or the link's token (without its leading slash).
func proxiedRest(path string) (bool, string) {
	if !isPortProxyPath(path) {
		return false, ""
	}
	var tail string
	if t, ok := strings.CutPrefix(path, "/p/"); ok {
		tail = t
	} else {
		// /v1/sandboxes/{id}/ports/{port}…
		t = strings.TrimPrefix(path, "/v1/sandboxes/")
		_, t, _ = strings.Cut(t, "/")
		tail = strings.TrimPrefix(t, "ports/")
	}
	_, rest, _ := strings.Cut(tail, "/")
	return true, rest
}
