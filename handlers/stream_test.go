package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// upgrade are the headers of a websocket handshake.
var upgrade = []string{
	"Connection", "Upgrade",
	"Upgrade", "websocket",
	"Sec-WebSocket-Version", "13",
	"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==",
}

// streamServer is a server whose stream workloads never start (not-running), so that every
// request ends before the upgrade with what the handler made of it.
func streamServer(t *testing.T) (*fakeSupervisor, http.Handler, *[]string) {
	f := &fakeSupervisor{startErr: errcode.New(errcode.NotRunning, "Sandbox a is not running; start it first.")}
	h, execs := newTestHandlers(t, f)
	return f, newTestServer(t, h), execs
}

// TestStreamQuery: the contract's bounds hold before the upgrade, as problems; what passes
// them reaches the supervisor as a workload.
func TestStreamQuery(t *testing.T) {
	t.Parallel()
	cases := []struct {
		query string
		ok    bool
	}{
		{"command=sh", true},
		{"command=sh&command=-c&command=echo+hi&env=A%3D1&cwd=/tmp&user=root&tty=true&rows=30&cols=100&timeout_ms=5000&wait_ms=10", true},
		{"", false},
		{"command=sh&tty=maybe", false},
		{"command=sh&rows=0", false},
		{"command=sh&cols=100000", false},
		{"command=sh&timeout_ms=0", false},
		{"command=sh&timeout_ms=99999999999", false},
		{"command=sh&wait_ms=-5", false},
	}
	for _, tc := range cases {
		f, s, _ := streamServer(t)
		code, body := do(t, s, "GET", "/v1/sandboxes/a/exec/stream?"+tc.query, "", upgrade...)
		if !tc.ok {
			if p := problemOf(t, body); code != http.StatusBadRequest || p.Code != string(errcode.InvalidRequest) {
				t.Errorf("%q: %d %+v, want 400 invalid-request", tc.query, code, p)
			}
			if len(f.admitted) != 0 {
				t.Errorf("%q: refused, but admitted", tc.query)
			}
			continue
		}
		if code != http.StatusConflict || len(f.execs) != 1 {
			t.Errorf("%q: %d %s with %d execs, want the fake's 409 after one exec", tc.query, code, body, len(f.execs))
			continue
		}
		req, wait := f.execs[0], f.admitted[0].wait
		if len(req.Argv) == 0 || wait <= 0 || req.Timeout <= 0 {
			t.Errorf("%q: accepted as %+v, wait %v", tc.query, req, wait)
		}
	}
}

// TestStreamRequest: the query maps onto the workload field by field, and what it leaves out
// takes the contract's defaults.
func TestStreamRequest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		query string
		want  supervisor.ExecRequest
		wait  time.Duration
	}{
		{"command=sh", supervisor.ExecRequest{Argv: []string{"sh"}, Rows: 24, Cols: 80, Timeout: time.Hour}, time.Minute},
		{
			"command=sh&command=-c&command=echo+hi&env=A%3D1&env=B%3D2&cwd=/tmp&user=root&tty=true&rows=30&cols=100&timeout_ms=5000&wait_ms=10",
			supervisor.ExecRequest{Argv: []string{"sh", "-c", "echo hi"}, Env: []string{"A=1", "B=2"}, Cwd: "/tmp", User: "root",
				TTY: true, Rows: 30, Cols: 100, Timeout: 5 * time.Second},
			10 * time.Millisecond,
		},
	}
	for _, tc := range cases {
		f, s, execs := streamServer(t)
		code, body := do(t, s, "GET", "/v1/sandboxes/a/exec/stream?"+tc.query, "", upgrade...)
		if p := problemOf(t, body); code != http.StatusConflict || p.Code != string(errcode.NotRunning) {
			t.Fatalf("%q: %d %+v, want the fake's not-running", tc.query, code, p)
		}
		if len(f.admitted) != 1 || f.admitted[0] != (admitCall{"a", tc.wait}) {
			t.Errorf("%q: admitted %+v, want sandbox a with wait %v", tc.query, f.admitted, tc.wait)
		}
		if got := f.execs[0]; !equalExec(got, tc.want) {
			t.Errorf("%q: workload %+v, want %+v", tc.query, got, tc.want)
		}
		// The workload was admitted, so its failure to start is an exec of the metrics.
		if !slices.Equal(*execs, []string{"stream not-running"}) {
			t.Errorf("%q: execs reported %q", tc.query, *execs)
		}
	}
}

func equalExec(a, b supervisor.ExecRequest) bool {
	return slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && a.Cwd == b.Cwd && a.User == b.User &&
		a.TTY == b.TTY && a.Rows == b.Rows && a.Cols == b.Cols && a.Timeout == b.Timeout
}

// TestStreamRefusals: a request that is no websocket handshake, or that the supervisor does
// not admit, is a problem response, and nothing starts.
func TestStreamRefusals(t *testing.T) {
	t.Parallel()
	f, s, execs := streamServer(t)
	code, body := do(t, s, "GET", "/v1/sandboxes/a/exec/stream?command=sh", "")
	if p := problemOf(t, body); code != http.StatusBadRequest || p.Field != "Upgrade" {
		t.Errorf("without the handshake: %d %+v, want 400 on Upgrade", code, p)
	}
	f.admitErr = errcode.New(errcode.SandboxBusy, "Another exec is running.")
	code, body = do(t, s, "GET", "/v1/sandboxes/a/exec/stream?command=sh", "", upgrade...)
	if p := problemOf(t, body); code != http.StatusLocked || p.Code != string(errcode.SandboxBusy) {
		t.Errorf("busy: %d %+v, want 423 sandbox-busy", code, p)
	}
	if len(f.execs) != 0 || len(*execs) != 0 {
		t.Errorf("refused, but %d workloads started and %d execs reported", len(f.execs), len(*execs))
	}
}

// TestStreamBinding: without the server's validation in front, a query that does not bind
// to the contract's types is still refused with the parameter at fault.
func TestStreamBinding(t *testing.T) {
	t.Parallel()
	for query, field := range map[string]string{
		"":                     "command",
		"command=sh&tty=maybe": "tty",
		"command=sh&rows=many": "rows",
		"command=sh&wait_ms=x": "wait_ms",
	} {
		f := &fakeSupervisor{}
		h, _ := newTestHandlers(t, f)
		var got error
		r := chi.NewRouter()
		r.Get("/v1/sandboxes/{id}/exec/stream", func(w http.ResponseWriter, r *http.Request) { got = h.ExecStream(w, r) })
		req := httptest.NewRequest("GET", "/v1/sandboxes/a/exec/stream?"+query, nil)
		for i := 0; i < len(upgrade); i += 2 {
			req.Header.Set(upgrade[i], upgrade[i+1])
		}
		r.ServeHTTP(httptest.NewRecorder(), req)
		var e *errcode.Error
		if !errors.As(got, &e) || e.Code != errcode.InvalidRequest || e.Field != field {
			t.Errorf("%q: %v, want invalid-request on %s", query, got, field)
		}
		if len(f.admitted) != 0 {
			t.Errorf("%q: refused, but admitted", query)
		}
	}
}

// TestDefaultsAreTheContracts: the defaults the handlers apply are those openapi.yaml
// declares, which the validator does not fill in.
func TestDefaultsAreTheContracts(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(openapi.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var streamOp *openapi3.Operation
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.OperationID == "execStream" {
				streamOp = op
			}
		}
	}
	if streamOp == nil {
		t.Fatal("the spec has no execStream operation")
	}
	param := func(name string) any {
		p := streamOp.Parameters.GetByInAndName("query", name)
		if p == nil {
			t.Fatalf("execStream has no query parameter %s", name)
		}
		return p.Schema.Value.Default
	}
	execProp := func(name string) any {
		return doc.Components.Schemas["ExecRequest"].Value.Properties[name].Value.Default
	}
	component := func(name string) any {
		return doc.Components.Parameters[name].Value.Schema.Value.Default
	}
	for name, c := range map[string]struct {
		spec any
		want float64
	}{
		"stream rows":        {param("rows"), defaultStreamRows},
		"stream cols":        {param("cols"), defaultStreamCols},
		"stream timeout_ms":  {param("timeout_ms"), float64(defaultStreamTimeout.Milliseconds())},
		"stream wait_ms":     {param("wait_ms"), float64(defaultExecWait.Milliseconds())},
		"exec timeout_ms":    {execProp("timeout_ms"), float64(defaultExecTimeout.Milliseconds())},
		"exec wait_ms":       {execProp("wait_ms"), float64(defaultExecWait.Milliseconds())},
		"transition timeout": {component("Timeout"), float64(defaultTimeout.Milliseconds())},
		"list limit":         {component("Limit"), defaultListLimit},
	} {
		if c.spec != c.want {
			t.Errorf("%s: the spec's default is %v, the handlers' %v", name, c.spec, c.want)
		}
	}
	if tty := param("tty"); tty != false {
		t.Errorf("stream tty: the spec's default is %v, the handlers' false", tty)
	}
}

// FuzzStreamQuery: whatever the query, serving it never panics, and what reaches the
// supervisor is within the bounds the agent and the admission rely on.
func FuzzStreamQuery(f *testing.F) {
	for _, seed := range []string{
		"command=sh", "command=sh&tty=1&rows=5&cols=5", "command=&wait_ms=1", "command=a&timeout_ms=3600000",
		"command=%00", "rows=65536&command=x", "command=x&cols=-1", "command=x;y", "%zz",
	} {
		f.Add(seed)
	}
	fake := &fakeSupervisor{startErr: errcode.New(errcode.NotRunning, "Not running.")}
	h, err := New(Config{Supervisor: fake})
	if err != nil {
		f.Fatal(err)
	}
	s := newTestServer(f, h)
	f.Fuzz(func(t *testing.T, query string) {
		fake.mu.Lock()
		fake.admitted, fake.execs = nil, nil
		fake.mu.Unlock()
		req := httptest.NewRequest("GET", "http://127.0.0.1/v1/sandboxes/a/exec/stream", nil)
		req.URL.RawQuery = query
		for i := 0; i < len(upgrade); i += 2 {
			req.Header.Set(upgrade[i], upgrade[i+1])
		}
		s.ServeHTTP(httptest.NewRecorder(), req.WithContext(context.Background()))
		if len(fake.execs) == 0 {
			return
		}
		r, wait := fake.execs[0], fake.admitted[0].wait
		if len(r.Argv) == 0 {
			t.Fatalf("%q: accepted without a command", query)
		}
		if wait <= 0 || wait > time.Hour {
			t.Fatalf("%q: wait %v", query, wait)
		}
		if r.Timeout <= 0 || r.Timeout > defaultStreamTimeout {
			t.Fatalf("%q: timeout %v", query, r.Timeout)
		}
		if r.TTY && (r.Rows < 1 || r.Rows > 1000 || r.Cols < 1 || r.Cols > 1000) {
			t.Fatalf("%q: size %dx%d", query, r.Rows, r.Cols)
		}
	})
}
