package server

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/bothy/bothy/openapi"
)

// contractServer serves every route of the table, the ones outside the strict interface
// included, with handlers that answer 200 when reached.
func contractServer(t *testing.T) *Server {
	t.Helper()
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
	s, _ := newTestServer(t, Config{
		Handlers:   fuzzHandlers{},
		Dashboard:  http.HandlerFunc(ok),
		Metrics:    http.HandlerFunc(ok),
		ExecStream: func(w http.ResponseWriter, r *http.Request) error { ok(w, r); return nil },
		Events:     func(w http.ResponseWriter, r *http.Request) error { ok(w, r); return nil },
	})
	return s
}

// specOperations lists the operations of the contract with a concrete path for each. The
// port proxies (x-proxy) are left out: their query is the sandbox's service's, passed on as
// it comes, so that no rule of the contract's operations applies to it.
func specOperations(t *testing.T) []struct{ method, path string } {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(openapi.Spec)
	if err != nil {
		t.Fatal(err)
	}
	param := regexp.MustCompile(`\{[^}]+\}`)
	var ops []struct{ method, path string }
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if _, proxy := op.Extensions["x-proxy"]; proxy {
				continue
			}
			ops = append(ops, struct{ method, path string }{method, param.ReplaceAllString(path, "a1")})
		}
	}
	if len(ops) < 25 {
		t.Fatalf("found only %d operations in the spec", len(ops))
	}
	return ops
}

// TestUnknownQueryParameterIsRefused: a parameter that an operation does not declare is
// refused with 400 naming it, on every operation of the contract (the websocket and the open
// routes included), as unknown body fields are. Without the check, `?forse=true` is ignored.
func TestUnknownQueryParameterIsRefused(t *testing.T) {
	t.Parallel()
	s := contractServer(t)
	for _, op := range specOperations(t) {
		req := httptest.NewRequest(op.method, "http://127.0.0.1"+op.path+"?bogus=1", nil)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != 400 {
			t.Errorf("%s %s?bogus=1: status %d, want 400: %s", op.method, op.path, rec.Code, rec.Body)
			continue
		}
		p := decodeProblem(t, rec)
		if p.Code != "invalid-request" || p.Field != "bogus" || !strings.Contains(p.Detail, `"bogus"`) {
			t.Errorf("%s %s?bogus=1: %+v, want invalid-request naming bogus", op.method, op.path, p)
		}
	}
	// A declared parameter next to the unknown one does not hide it.
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("POST", "http://127.0.0.1/v1/sandboxes/a1/stop?force=true&forse=true", nil))
	if p := decodeProblem(t, rec); rec.Code != 400 || p.Field != "forse" {
		t.Errorf("stop?force=true&forse=true: %d %+v, want 400 naming forse", rec.Code, p)
	}
}

// TestTrailingDataAfterJSONBodyIsRefused: a body is one JSON value; what follows it is not
// silently dropped.
func TestTrailingDataAfterJSONBodyIsRefused(t *testing.T) {
	t.Parallel()
	s := contractServer(t)
	for _, body := range []string{`{"id":"a"} {"start":true}`, `{"id":"a"}x`, `{} {}`, `{"command":["true"]}[]`} {
		for _, path := range []string{"/v1/sandboxes", "/v1/sandboxes/a1/exec"} {
			req := httptest.NewRequest("POST", "http://127.0.0.1"+path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			if p := decodeProblem(t, rec); rec.Code != 400 || p.Code != "invalid-request" || p.Field != "body" {
				t.Errorf("POST %s %q: %d %+v, want 400 invalid-request on body", path, body, rec.Code, p)
			}
		}
	}
	// White space after the value is no second value.
	req := httptest.NewRequest("POST", "http://127.0.0.1/v1/sandboxes", strings.NewReader("{\"id\":\"a1\"}\n\t \n"))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotImplemented { // fuzzHandlers' answer: the body reached it
		t.Errorf("a body with trailing white space: %d %s", rec.Code, rec.Body)
	}
}

// TestWrongMethodIsA405WithAllow: every route, the dashboard, metrics and assets included,
// answers a method it does not serve with 405 and the Allow header RFC 9110 requires.
func TestWrongMethodIsA405WithAllow(t *testing.T) {
	t.Parallel()
	s := contractServer(t)
	cases := []struct{ method, path, allow string }{
		{"DELETE", "/", "GET"},
		{"TRACE", "/", "GET"},
		{"POST", "/metrics", "GET"},
		{"DELETE", "/assets/app.js", "GET"},
		{"PUT", "/openapi.yaml", "GET"},
		{"PATCH", "/v1/sandboxes", "GET, POST"},
		{"PUT", "/v1/sandboxes/a1", "GET, DELETE"},
		{"POST", "/v1/sandboxes/a1/files", "GET, PUT, DELETE"},
		{"DELETE", "/v1/info", "GET"},
		{"GET", "/login", "POST"},
		// Routes outside the generated router, whose handlers would take any method
		// (issue 38): the contract's methods hold there too.
		{"TRACE", "/p/0123456789abcdef0123456789abcdef.abc/x/y", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"},
		{"TRACE", "/p/0123456789abcdef0123456789abcdef.abc", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"},
		{"TRACE", "/v1/sandboxes/a1/ports/80/x", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"},
		{"PROPFIND", "/v1/sandboxes/a1/ports/80/", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"},
		{"TRACE", "/v1/sandboxes/a1/ports/80/tcp", "GET"},
		{"POST", "/v1/sandboxes/a1/ports/80/tcp", "GET"},
		{"PUT", "/v1/sandboxes/a1/ports/80/links", "GET, POST"},
		{"POST", "/v1/sandboxes/a1/links", "GET"},
		{"GET", "/v1/sandboxes/a1/ports/80/links/0123456789abcdef0123456789abcdef", "DELETE"},
		{"POST", "/v1/sandboxes/a1/exec/stream", "GET"},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(tc.method, "http://127.0.0.1"+tc.path, nil))
		p := decodeProblem(t, rec)
		if rec.Code != 405 || p.Code != "method-not-allowed" {
			t.Errorf("%s %s: %d %q, want 405 method-not-allowed", tc.method, tc.path, rec.Code, p.Code)
		}
		if got := rec.Header().Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
}

// TestMessagesNameTheFieldAndTheRule: every refusal of the validator is a sentence that
// names the field or parameter at fault and says what it must be, in the client's terms: no
// "allOf", no json.Number, no float notation, no Go struct, nothing said twice.
func TestMessagesNameTheFieldAndTheRule(t *testing.T) {
	t.Parallel()
	s := contractServer(t)
	idRule := "1–63 characters of a-z, 0-9 and '-', starting with a letter or a digit"
	cases := []struct {
		name, method, path, body string
		field, wantDetail        string
	}{
		{"bad id in a body", "POST", "/v1/sandboxes", `{"id":"Demo"}`, "id", idRule},
		{"slash in an id", "POST", "/v1/sandboxes", `{"id":"a/b"}`, "id", idRule},
		{"empty id", "POST", "/v1/sandboxes", `{"id":""}`, "id", idRule},
		{"long id", "POST", "/v1/sandboxes", `{"id":"` + strings.Repeat("a", 64) + `"}`, "id", idRule},
		{"bad id in a path", "GET", "/v1/sandboxes/Demo", ``, "id", idRule},
		{"bad image", "POST", "/v1/sandboxes", `{"image":"A"}`, "image", "starting with a letter or a digit"},
		{"huge number", "POST", "/v1/sandboxes", `{"resources":{"memory_mb":1e999}}`, "resources.memory_mb", "whole number"},
		{"bound in a body", "POST", "/v1/sandboxes/a1/exec", `{"command":["true"],"timeout_ms":99999999}`, "timeout_ms", "at most 3600000"},
		{"bound in a query", "POST", "/v1/sandboxes?timeout=99999999", `{}`, "timeout", "at most 3600000"},
		{"exponent for an integer", "POST", "/v1/sandboxes/a1/exec", `{"command":["true"],"timeout_ms":1e3}`, "timeout_ms", "whole number"},
		{"missing parameter", "GET", "/v1/sandboxes/a1/files", ``, "path", `"path" is required; add it.`},
		{"empty parameter", "POST", "/v1/sandboxes?timeout=", `{}`, "timeout", `"timeout" is empty`},
		{"unknown body field", "POST", "/v1/sandboxes", `{"resources":{"cpus":1}}`, "resources.cpus", "not a field"},
		{"missing body field", "POST", "/v1/sandboxes/a1/exec", `{}`, "command", `"command" is required`},
		{"empty command", "POST", "/v1/sandboxes/a1/exec", `{"command":[]}`, "command", "at least 1 item"},
		{"bad item of an array", "POST", "/v1/sandboxes", `{"network":{"allow":["example.com","10.0.0.0/33"]}}`, "network.allow[1]", "IPv4"},
	}
	garbage := []string{"allOf", "json.Number", "e+0", "Go struct", "ExecRequest", "missing: value", "allowed: empty"}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(tc.method, "http://127.0.0.1"+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			p := decodeProblem(t, rec)
			if rec.Code != 400 || p.Field != tc.field {
				t.Fatalf("%d field %q (%s), want 400 field %q", rec.Code, p.Field, p.Detail, tc.field)
			}
			if !strings.Contains(p.Detail, tc.wantDetail) || !strings.HasPrefix(p.Detail, "The ") || !strings.HasSuffix(p.Detail, ".") {
				t.Errorf("detail %q: want a sentence saying %q", p.Detail, tc.wantDetail)
			}
			for _, g := range garbage {
				if strings.Contains(p.Detail, g) {
					t.Errorf("detail %q says %q", p.Detail, g)
				}
			}
		})
	}
}

// TestSchemaSaysWhatTheServerAccepts: a generation id that the store would refuse is refused by
// the contract itself, so that a client generated from it cannot build one.
func TestSchemaSaysWhatTheServerAccepts(t *testing.T) {
	t.Parallel()
	s := contractServer(t)
	for _, gen := range []string{"0", "a1", "g-1", "gx"} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/templates/t1/generations/"+gen, nil))
		if p := decodeProblem(t, rec); rec.Code != 400 || p.Field != "gen" {
			t.Errorf("generation %q: %d %+v, want 400 on gen", gen, rec.Code, p)
		}
	}
	// host is the built-in image, no stored one: the contract refuses it under /v1/images/
	// (issue 38), and takes every other name of the rule.
	for name, refused := range map[string]bool{"host": true, "busybox": false, "hosts": false, "hos": false, "hist": false, "h0st": false, "g000001x": false} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/images/"+name, nil))
		if got := rec.Code == 400; got != refused {
			t.Errorf("GET /v1/images/%s: %d %s, want refused %v", name, rec.Code, rec.Body, refused)
		}
	}
}

// TestProxiedPathParametersAreValidated: the port proxy and the links are judged by the
// contract for their path parameters before their handlers run (issue 38: a mutated port or
// sandbox id reached the sandbox check first), while their query stays the service's.
func TestProxiedPathParametersAreValidated(t *testing.T) {
	t.Parallel()
	reached := 0
	link := func(w http.ResponseWriter, _ *http.Request) error {
		reached++
		w.WriteHeader(http.StatusTeapot)
		return nil
	}
	s, _ := newTestServer(t, Config{Handlers: fuzzHandlers{}, Ports: PortRoutes{Proxy: link, Link: link, Tunnel: link}})
	token := "0123456789abcdef0123456789abcdef.abc"
	for _, tc := range []struct{ method, path, field string }{
		{"GET", "/v1/sandboxes/a1/ports/0/", "port"},
		{"GET", "/v1/sandboxes/a1/ports/65536/x/y", "port"},
		{"POST", "/v1/sandboxes/a1/ports/http/x", "port"},
		{"GET", "/v1/sandboxes/Bad/ports/80/", "id"},
		{"GET", "/v1/sandboxes/a1/ports/0/tcp", "port"},
		{"GET", "/p/nope/", "token"},
		{"DELETE", "/p/nope/x/y", "token"},
		{"GET", "/v1/sandboxes/a1/ports/80/" + strings.Repeat("a", 8193), "path"},
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(tc.method, "http://127.0.0.1"+tc.path, nil))
		if p := decodeProblem(t, rec); rec.Code != 400 || p.Field != tc.field {
			t.Errorf("%s %.80s: %d %+v, want 400 on %s", tc.method, tc.path, rec.Code, p, tc.field)
		}
	}
	if reached != 0 {
		t.Errorf("%d invalid requests reached the proxy", reached)
	}
	for _, path := range []string{"/v1/sandboxes/a1/ports/80/x/y?anything=1", "/p/" + token + "/a/b?q=1", "/p/" + token} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("PATCH", "http://127.0.0.1"+path, strings.NewReader("not json")))
		if rec.Code != http.StatusTeapot {
			t.Errorf("PATCH %s: %d %s, want the proxy's answer", path, rec.Code, rec.Body)
		}
	}
}

// TestUndecodableRequestsAreProblems: a query that does not decode and a body that cannot be
// read are invalid-request problems (issue 38): the query's pairs were dropped silently
// (`?state=%zz` listed every sandbox), and a malformed chunked body was a 500.
func TestUndecodableRequestsAreProblems(t *testing.T) {
	t.Parallel()
	s := contractServer(t)
	for _, target := range []string{"/v1/sandboxes?state=%zz", "/v1/sandboxes?x=%zz", "/v1/sandboxes?state=running;x", "/v1/info?%"} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1"+target, nil))
		if p := decodeProblem(t, rec); rec.Code != 400 || p.Code != "invalid-request" || strings.Contains(p.Detail, "zz") {
			t.Errorf("GET %s: %d %+v, want 400 invalid-request that does not quote the query", target, rec.Code, p)
		}
	}
	req := httptest.NewRequest("POST", "http://127.0.0.1/v1/sandboxes", iotest.ErrReader(errors.New("http: malformed chunked encoding")))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if p := decodeProblem(t, rec); rec.Code != 400 || p.Code != "invalid-request" {
		t.Errorf("a body that cannot be read: %d %+v, want 400 invalid-request", rec.Code, p)
	}
}

// TestExtensionRulesAreValidated: the rules the contract states in extensions, because
// OpenAPI 3.0 has no keyword for them (x-first-item, x-key-pattern), are the validator's too,
// before any handler (issue 38).
func TestExtensionRulesAreValidated(t *testing.T) {
	t.Parallel()
	s := contractServer(t)
	for _, tc := range []struct{ name, method, path, body, field string }{
		{"empty program", "POST", "/v1/sandboxes/a1/exec", `{"command":["","x"]}`, "command"},
		{"label key", "POST", "/v1/sandboxes", `{"labels":{"team":"a","Team":"x"}}`, "labels"},
		{"label key ending in a dot", "POST", "/v1/sandboxes", `{"labels":{"team.":"x"}}`, "labels"},
		{"empty program on the stream", "GET", "/v1/sandboxes/a1/exec/stream?command=&command=x", "", "command"},
	} {
		req := httptest.NewRequest(tc.method, "http://127.0.0.1"+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		req.Header.Set("Sec-WebSocket-Version", "13")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if p := decodeProblem(t, rec); rec.Code != 400 || p.Field != tc.field {
			t.Errorf("%s: %d %+v, want 400 on %s", tc.name, rec.Code, p, tc.field)
		}
	}
	// An empty argument after the program is an argument like any other.
	req := httptest.NewRequest("POST", "http://127.0.0.1/v1/sandboxes/a1/exec", strings.NewReader(`{"command":["echo",""]}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotImplemented { // fuzzHandlers' answer: the request reached it
		t.Errorf("an empty argument: %d %s", rec.Code, rec.Body)
	}
}
