package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
)

// TestEveryCodeHasAStatus keeps the mapper's table complete: a code added to errcode without
// a status would otherwise become a 500.
func TestEveryCodeHasAStatus(t *testing.T) {
	t.Parallel()
	for _, code := range allCodes(t) {
		if _, ok := statusOf[code]; !ok {
			t.Errorf("errcode %q has no HTTP status in statusOf", code)
		}
	}
}

// allCodes lists the Code constants of the errcode package by parsing its source, so that the
// test follows the package without a hand-kept list.
func allCodes(t *testing.T) []errcode.Code {
	t.Helper()
	codes, err := parseCodes("../errcode/errcode.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(codes) < 20 {
		t.Fatalf("found only %d codes in errcode; the parser is broken", len(codes))
	}
	return codes
}

func TestClassify(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want errcode.Code
	}{
		{"coded", errcode.New(errcode.SandboxBusy, "busy"), errcode.SandboxBusy},
		{"wrapped coded", fmt.Errorf("exec: %w", errcode.New(errcode.NotRunning, "stopped")), errcode.NotRunning},
		{"body too large", fmt.Errorf("decoding: %w", &http.MaxBytesError{Limit: 10}), errcode.PayloadTooLarge},
		{"plain error", errors.New("open /var/lib/bothy/secret: permission denied"), errcode.Internal},
		{"unknown code", errcode.New(errcode.Code("made-up"), "x"), errcode.Internal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := classify(tc.err)
			if got.Code != tc.want {
				t.Fatalf("classify(%v) = %q, want %q", tc.err, got.Code, tc.want)
			}
			if tc.want == errcode.Internal && strings.Contains(got.Msg, "/var/lib") {
				t.Fatalf("an internal error leaks its cause: %q", got.Msg)
			}
		})
	}
}

// panicky panics in one operation, to exercise the recoverer behind the strict handler. The
// other operations are not called by these tests (the nil interface would panic if they were).
type panicky struct{ openapi.StrictServerInterface }

func (panicky) GetInfo(context.Context, openapi.GetInfoRequestObject) (openapi.GetInfoResponseObject, error) {
	panic("secret internal state")
}

func newTestServer(t *testing.T, cfg Config) (*Server, *bytes.Buffer) {
	t.Helper()
	logs := &bytes.Buffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	if cfg.Handlers == nil {
		cfg.Handlers = panicky{}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, logs
}

func decodeProblem(t *testing.T, rec *httptest.ResponseRecorder) problem {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, body %s", ct, rec.Body)
	}
	var p problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPanicBecomesABare500(t *testing.T) {
	t.Parallel()
	s, logs := newTestServer(t, Config{})
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/info", nil))
	p := decodeProblem(t, rec)
	if rec.Code != 500 || p.Code != "internal" {
		t.Fatalf("got %d %q, want 500 internal", rec.Code, p.Code)
	}
	if strings.Contains(rec.Body.String(), "secret") {
		t.Fatalf("the response leaks the panic: %s", rec.Body)
	}
	if !strings.Contains(logs.String(), "secret internal state") {
		t.Fatalf("the panic is not logged for the operator")
	}
}

func TestRoutesNotBuiltAnswer501(t *testing.T) {
	t.Parallel()
	s, _ := newTestServer(t, Config{})
	for _, path := range []string{"/v1/events", "/metrics", "/v1/sandboxes/a1/exec/stream?command=true"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "http://127.0.0.1"+path, nil)
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		req.Header.Set("Sec-WebSocket-Version", "13")
		s.ServeHTTP(rec, req)
		if p := decodeProblem(t, rec); rec.Code != 501 || p.Code != "not-implemented" {
			t.Errorf("%s: got %d %q, want 501 not-implemented", path, rec.Code, p.Code)
		}
	}
}

func TestAccessLogRedactsTokens(t *testing.T) {
	t.Parallel()
	const token = "do-not-log-this-token-123"
	s, logs := newTestServer(t, Config{Token: token})
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/sandboxes/a1/exec/stream?command=true&access_token="+token, nil))
	if rec.Code == http.StatusUnauthorized {
		t.Fatalf("the query token was refused on the websocket route: %s", rec.Body)
	}
	if strings.Contains(logs.String(), token) {
		t.Fatalf("the token reached the log:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "REDACTED") {
		t.Fatalf("the access log does not show the redacted query:\n%s", logs)
	}
}

// hijackable is a ResponseWriter that supports Hijack and Flush, like net/http's.
type hijackable struct {
	httptest.ResponseRecorder
	hijacked bool
}

func (h *hijackable) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h.hijacked = true
	c1, _ := net.Pipe()
	return c1, bufio.NewReadWriter(bufio.NewReader(c1), bufio.NewWriter(c1)), nil
}

// TestMiddlewareKeepsHijackAndFlush guards websockets and streaming behind the access log.
func TestMiddlewareKeepsHijackAndFlush(t *testing.T) {
	t.Parallel()
	var flushErr, hijackErr error
	s, logs := newTestServer(t, Config{ExecStream: func(w http.ResponseWriter, r *http.Request) error {
		flushErr = http.NewResponseController(w).Flush()
		_, _, hijackErr = http.NewResponseController(w).Hijack()
		return nil
	}})
	w := &hijackable{ResponseRecorder: *httptest.NewRecorder()}
	req := httptest.NewRequest("GET", "http://127.0.0.1/v1/sandboxes/a1/exec/stream?command=true", nil)
	// The headers the contract requires of a websocket's request.
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Sec-WebSocket-Version", "13")
	s.ServeHTTP(w, req)
	if flushErr != nil || hijackErr != nil || !w.hijacked {
		t.Fatalf("flush: %v, hijack: %v, hijacked: %v", flushErr, hijackErr, w.hijacked)
	}
	if !strings.Contains(logs.String(), `"status":200`) && !strings.Contains(logs.String(), `"status":101`) {
		t.Fatalf("the access log has no status for the hijacked request:\n%s", logs)
	}
}

func TestCheckListener(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:0", "", true},
		{"[::1]:0", "", true},
		{"0.0.0.0:0", "", false},
		{"0.0.0.0:0", "a-token-of-some-length", true},
	} {
		ln, err := net.Listen("tcp", tc.addr)
		if err != nil {
			t.Logf("skipping %s: %v", tc.addr, err)
			continue
		}
		err = CheckListener(ln, tc.token)
		ln.Close()
		if (err == nil) != tc.ok {
			t.Errorf("CheckListener(%s, token=%v) = %v, want ok=%v", tc.addr, tc.token != "", err, tc.ok)
		}
	}
}

func TestIsLoopbackHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1:7780": true, "localhost": true, "LOCALHOST:1": true, "[::1]:7780": true, "127.3.4.5": true,
		"evil.example": false, "localhost.evil.example": false, "10.0.0.1:7780": false, "": false,
	} {
		if got := isLoopbackHost(host); got != want {
			t.Errorf("isLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// TestAccessLogRedactsEnv: the exec websocket takes the command's environment in its query,
// where callers pass secrets; the access log keeps the names and drops the values.
func TestAccessLogRedactsEnv(t *testing.T) {
	t.Parallel()
	s, logs := newTestServer(t, Config{})
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/sandboxes/a1/exec/stream?command=env&env=API_KEY%3Dhunter2-secret&env=B%3Dsecond%3Dpart", nil))
	if strings.Contains(logs.String(), "hunter2") || strings.Contains(logs.String(), "second") {
		t.Fatalf("an env value reached the log:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "API_KEY%3DREDACTED") {
		t.Fatalf("the access log does not name the redacted variable:\n%s", logs)
	}
}

// TestWakingSaysWhenToRetry: sandbox-waking is a 503 with Retry-After, as a client's retry
// loop (and a browser) reads it.
func TestWakingSaysWhenToRetry(t *testing.T) {
	t.Parallel()
	s, _ := newTestServer(t, Config{})
	rec := httptest.NewRecorder()
	s.writeProblem(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/sandboxes/a1/ports/80/", nil),
		errcode.New(errcode.SandboxWaking, "Sandbox a1 is waking from its sleep; retry in a few seconds."))
	if p := decodeProblem(t, rec); rec.Code != 503 || p.Code != "sandbox-waking" || rec.Header().Get("Retry-After") != wakeRetryAfter {
		t.Fatalf("got %d %q Retry-After %q", rec.Code, p.Code, rec.Header().Get("Retry-After"))
	}
}
