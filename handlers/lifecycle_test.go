package handlers

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/bothy/bothy/events"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// TestDeleteForce: force=true reaches the supervisor; without it, a plain delete.
func TestDeleteForce(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{}
	h, _ := newTestHandlers(t, f)
	s := newTestServer(t, h)
	for _, target := range []string{"/v1/sandboxes/a?force=true", "/v1/sandboxes/b"} {
		if code, body := do(t, s, "DELETE", target, ""); code != http.StatusNoContent {
			t.Fatalf("%s: %d %s", target, code, body)
		}
	}
	if len(f.deleted) != 2 || f.deleted[0] != (deleteCall{"a", true}) || f.deleted[1] != (deleteCall{"b", false}) {
		t.Fatalf("deletes %+v", f.deleted)
	}
}

// TestCreateLifetime: timeout_s and on_timeout become the create's lifetime, the server's
// default applies when the request names none, and start is the supervisor's to do.
func TestCreateLifetime(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{}
	h, err := New(Config{Supervisor: f, DefaultTimeoutS: 600, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s := newTestServer(t, h)
	do(t, s, "POST", "/v1/sandboxes", `{"id":"l1","timeout_s":60,"on_timeout":"delete","start":true}`)
	do(t, s, "POST", "/v1/sandboxes", `{"id":"l2"}`)
	if len(f.created) != 2 {
		t.Fatalf("%d creates", len(f.created))
	}
	if lt := f.created[0].Lifetime; lt == nil || lt.Timeout != time.Minute || lt.OnTimeout != supervisor.TimeoutDelete || !f.created[0].Start {
		t.Errorf("l1: %+v, lifetime %+v", f.created[0], lt)
	}
	if lt := f.created[1].Lifetime; lt == nil || lt.Timeout != 10*time.Minute || lt.OnTimeout != supervisor.TimeoutStop || f.created[1].Start {
		t.Errorf("l2: %+v, lifetime %+v", f.created[1], lt)
	}
	if code, _ := do(t, s, "POST", "/v1/sandboxes", `{"timeout_s":2592001}`); code != http.StatusBadRequest {
		t.Errorf("a lifetime over 30 days: %d, want 400", code)
	}
}

// TestWaitFollowsEvents: a wait answers when an event names the sandbox and it is then in
// the state; a change that no event reports is not seen (the store is not polled), so the
// wait ends with wait-timeout; a sandbox that is gone satisfies state=deleted.
func TestWaitFollowsEvents(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{status: map[string]*supervisor.Status{
		"w": {Config: supervisor.Config{ID: "w"}, State: supervisor.StateProvisioned},
	}}
	bus := events.New(events.Options{})
	h, err := New(Config{Supervisor: f, Events: bus, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s := newTestServer(t, h)

	// Without an event, a change is not seen.
	f.mu.Lock()
	f.status["w"] = &supervisor.Status{Config: supervisor.Config{ID: "w"}, State: supervisor.StateRunning}
	f.mu.Unlock()
	code, body := do(t, s, "GET", "/v1/sandboxes/w/wait?state=stopped&timeout_ms=100", "")
	if code != http.StatusRequestTimeout || problemOf(t, body).Code != "wait-timeout" {
		t.Fatalf("wait for a state never reached: %d %s", code, body)
	}

	type answer struct {
		code int
		body []byte
	}
	done := make(chan answer, 1)
	go func() {
		c, b := do(t, s, "GET", "/v1/sandboxes/w/wait?state=stopped&timeout_ms=30000", "")
		done <- answer{c, b}
	}()
	// Publish until the wait has answered: an event published before it subscribed is
	// missed, but then its first read sees the new state.
	f.mu.Lock()
	f.status["w"] = &supervisor.Status{Config: supervisor.Config{ID: "w"}, State: supervisor.StateStopped}
	f.mu.Unlock()
	id := "w"
	var got answer
	for got.code == 0 {
		bus.Publish(openapi.Event{Type: openapi.EventType(supervisor.EventStopped), Sandbox: &id})
		select {
		case got = <-done:
		case <-time.After(10 * time.Millisecond):
		}
	}
	var sb openapi.Sandbox
	if got.code != http.StatusOK || json.Unmarshal(got.body, &sb) != nil || sb.State != openapi.SandboxStateStopped {
		t.Fatalf("wait for stopped: %d %s", got.code, got.body)
	}

	if code, body := do(t, s, "GET", "/v1/sandboxes/gone/wait?state=deleted", ""); code != http.StatusNoContent {
		t.Fatalf("wait for deleted of a missing sandbox: %d %s", code, body)
	}
	if code, body := do(t, s, "GET", "/v1/sandboxes/gone/wait?state=running", ""); code != http.StatusNotFound {
		t.Fatalf("wait for running of a missing sandbox: %d %s", code, body)
	}
}
