package bothy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": "x", "status": status, "code": code, "detail": detail})
}

func newTestClient(t *testing.T, h http.Handler) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, WithToken("tok"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestErrorsByCode(t *testing.T) {
	t.Parallel()
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			problem(w, 401, "unauthorized", "No token.")
			return
		}
		problem(w, 404, "sandbox-not-found", "There is no sandbox nope.")
	}))
	_, err := c.Get(context.Background(), "nope")
	if !errors.Is(err, ErrSandboxNotFound) || errors.Is(err, ErrNotFound) {
		t.Fatalf("errors.Is by code: %v", err)
	}
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 404 || apiErr.Detail != "There is no sandbox nope." {
		t.Fatalf("errors.As: %#v", err)
	}
	if got := err.Error(); got != "There is no sandbox nope. (sandbox-not-found, HTTP 404)" {
		t.Fatalf("the message: %q", got)
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c, err := New("http://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Info(context.Background()); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a closed port: %v", err)
	}
	if _, err := c.ExecStream(context.Background(), "x", []string{"true"}, nil); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a closed port, websocket: %v", err)
	}
}

// TestWaitTimesOut: a server without GET /wait answers it with the route's not-found, and
// Wait follows the event stream instead; with no event about the sandbox it ends with
// wait-timeout at its deadline.
func TestWaitTimesOut(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/sb/wait", func(w http.ResponseWriter, r *http.Request) {
		problem(w, 404, "not-found", "There is no route.")
	})
	mux.HandleFunc("GET /v1/sandboxes/sb", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "sb", "state": "running", "created_at": time.Now()})
	})
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, ": ping\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	c := newTestClient(t, mux)
	if _, err := c.Wait(context.Background(), "sb", "stopped", 200*time.Millisecond); !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("a wait that no event ends: %v", err)
	}
	if sb, err := c.Wait(context.Background(), "sb", "running", time.Second); err != nil || sb.State != "running" {
		t.Fatalf("a wait for the state it is in: %v %v", sb, err)
	}
}

// TestWaitByEventsSeesTheChange: the event that names the sandbox makes Wait look again.
func TestWaitByEventsSeesTheChange(t *testing.T) {
	t.Parallel()
	stopped := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/sb/wait", func(w http.ResponseWriter, r *http.Request) {
		problem(w, 405, "method-not-allowed", "No.")
	})
	mux.HandleFunc("GET /v1/sandboxes/sb", func(w http.ResponseWriter, r *http.Request) {
		s := "running"
		select {
		case <-stopped:
			s = "stopped"
		default:
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "sb", "state": s, "created_at": time.Now()})
	})
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "id: 1\nevent: sandbox.started\ndata: {\"seq\":1,\"type\":\"sandbox.started\",\"at\":\"2026-01-01T00:00:00Z\",\"sandbox\":\"other\",\"state\":\"running\"}\n\n")
		w.(http.Flusher).Flush()
		// The change comes after Wait's first read of the sandbox, which follows its
		// subscription: readHook says when that read is done.
		<-stoppedAfterRead
		close(stopped)
		fmt.Fprint(w, "id: 2\nevent: sandbox.stopped\ndata: {\"seq\":2,\"type\":\"sandbox.stopped\",\"at\":\"2026-01-01T00:00:01Z\",\"sandbox\":\"sb\",\"state\":\"stopped\"}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	c := newTestClient(t, readHook{mux})
	sb, err := c.Wait(context.Background(), "sb", "stopped", 10*time.Second)
	if err != nil || sb.State != "stopped" {
		t.Fatalf("wait: %v %v", sb, err)
	}
}

// stoppedAfterRead is closed by readHook at the first read of the sandbox.
var stoppedAfterRead = make(chan struct{})

type readHook struct{ h http.Handler }

func (rh readHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rh.h.ServeHTTP(w, r)
	if r.URL.Path == "/v1/sandboxes/sb" {
		select {
		case <-stoppedAfterRead:
		default:
			close(stoppedAfterRead)
		}
	}
}

// TestExecStream speaks the frame protocol with a fake server: stdin frames and eof in, output
// frames and the exit out.
func TestExecStream(t *testing.T) {
	t.Parallel()
	up := websocket.Upgrader{}
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb/exec/stream" || r.URL.Query()["command"][1] != "-c" || r.Header.Get("Authorization") != "Bearer tok" {
			problem(w, 400, "invalid-request", "Bad: "+r.URL.String())
			return
		}
		if r.URL.Query().Get("tty") == "true" {
			problem(w, 409, "not-running", "Sandbox sb is not running.")
			return
		}
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		var in []byte
		var resized string
		for {
			kind, data, err := conn.ReadMessage()
			if err != nil {
				return
			}
			if kind == websocket.BinaryMessage && data[0] == 0 {
				in = append(in, data[1:]...)
				continue
			}
			if strings.Contains(string(data), "resize") {
				resized = string(data)
				continue
			}
			if strings.Contains(string(data), "eof") {
				break
			}
		}
		_ = conn.WriteMessage(websocket.BinaryMessage, append([]byte{1}, in...))
		_ = conn.WriteMessage(websocket.BinaryMessage, append([]byte{2}, resized...))
		_ = conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"exit","exit_code":3,"signal":null,"timed_out":false}`))
		_ = conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
	}))
	ctx := context.Background()
	if _, err := c.ExecStream(ctx, "sb", []string{"sh", "-c", "x"}, &ExecOptions{TTY: true}); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("a refusal before the upgrade: %v", err)
	}
	s, err := c.ExecStream(ctx, "sb", []string{"sh", "-c", "cat"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := io.WriteString(s, "hello"); err != nil {
		t.Fatal(err)
	}
	if err := s.Resize(30, 100); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	exit, err := s.Copy(&out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello" || !strings.Contains(errOut.String(), `"rows":30`) || exit.Code != 3 {
		t.Fatalf("stdout %q, stderr %q, exit %+v", out.String(), errOut.String(), exit)
	}
}

// TestSleepOptionsJSON: auto_resume goes out only when turned off, the server's default being on.
func TestSleepOptionsJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    SleepOptions
		want string
	}{
		{"default", SleepOptions{IdleTimeoutS: 30}, `{"idle_timeout_seconds":30}`},
		{"no auto resume, ignoring work", SleepOptions{IdleTimeoutS: 5, NoAutoResume: true, IgnoreWork: true}, `{"idle_timeout_seconds":5,"idle_ignores_work":true,"auto_resume":false}`},
	} {
		b, err := json.Marshal(CreateOptions{Sleep: &tc.o})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"sleep":` + tc.want + `}`; string(b) != want {
			t.Errorf("%s: %s, want %s", tc.name, b, want)
		}
	}
}

// TestFileRefusalsByCode: a refusal of the sandbox's files matches its own Err value, not
// ErrInvalidRequest, and carries the field whose path was refused.
func TestFileRefusalsByCode(t *testing.T) {
	t.Parallel()
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(409)
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "urn:bothyd:problem:is-a-directory", "title": "Conflict",
			"status": 409, "code": "is-a-directory", "field": "path", "detail": "\"/tmp\" is a directory."})
	}))
	_, err := c.ReadFile(context.Background(), "sb", "/tmp")
	if !errors.Is(err, ErrIsADirectory) || errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("errors.Is by code: %v", err)
	}
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 409 || apiErr.Field != "path" {
		t.Fatalf("errors.As: %#v", err)
	}
}
