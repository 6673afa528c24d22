package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/openapi"
)

// sse is a subscriber of /v1/events.
type sse struct {
	t      testing.TB
	events chan sseEvent
	cancel context.CancelFunc
}

// sseEvent is one server-sent event: its id and event fields, and its data decoded.
type sseEvent struct {
	ID    string
	Type  string
	Event openapi.Event
}

// subscribe opens /v1/events (with the token in the header, or as access_token when
// queryToken) and returns once the stream is open: events published after that are seen.
func (d *daemon) subscribe(lastID string, queryToken bool) *sse {
	d.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	path := "/v1/events"
	if queryToken && d.Token != "" {
		path += "?access_token=" + d.Token
	}
	req, err := http.NewRequestWithContext(ctx, "GET", d.URL+path, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	if !queryToken && d.Token != "" {
		req.Header.Set("Authorization", "Bearer "+d.Token)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := d.checkedClient(nil).Do(req)
	if err != nil {
		cancel()
		d.t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		cancel()
		d.t.Fatalf("GET /v1/events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	s := &sse{t: d.t, events: make(chan sseEvent, 64), cancel: cancel}
	opened := make(chan struct{})
	go func() {
		defer func() { _ = resp.Body.Close() }()
		defer close(s.events)
		r := bufio.NewReader(resp.Body)
		var cur sseEvent
		var data string
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == ": connected":
				close(opened)
			case line == "" && cur.Type != "":
				if err := json.Unmarshal([]byte(data), &cur.Event); err != nil {
					d.t.Errorf("event data does not parse: %v: %s", err, data)
				}
				s.events <- cur
				cur, data = sseEvent{}, ""
			case strings.HasPrefix(line, "id: "):
				cur.ID = line[len("id: "):]
			case strings.HasPrefix(line, "event: "):
				cur.Type = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				data = line[len("data: "):]
			}
		}
	}()
	select {
	case <-opened:
	case <-time.After(10 * time.Second):
		cancel()
		d.t.Fatal("the event stream did not open within 10s")
	}
	d.t.Cleanup(cancel)
	return s
}

// next returns the next event about the sandbox, skipping others.
func (s *sse) next(sandbox string) sseEvent {
	s.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e, ok := <-s.events:
			if !ok {
				s.t.Fatal("the event stream ended")
			}
			if e.Event.Sandbox != nil && *e.Event.Sandbox == sandbox {
				return e
			}
		case <-deadline:
			s.t.Fatalf("no event about %s within 30s", sandbox)
		}
	}
}

// nextOf returns the next event of type typ, skipping others.
func (s *sse) nextOf(typ string) sseEvent {
	s.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e, ok := <-s.events:
			if !ok {
				s.t.Fatal("the event stream ended")
			}
			if e.Type == typ {
				return e
			}
		case <-deadline:
			s.t.Fatalf("no %s event within 30s", typ)
		}
	}
}

// TestEventsOfALifecycle: a subscriber sees a sandbox's lifecycle in order, numbered by one,
// including the exit of a sandbox whose init dies; a reconnect with Last-Event-ID replays
// what it missed. The token comes as access_token, as the dashboard's EventSource sends it.
func TestEventsOfALifecycle(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withToken("events-test-token-0123456789"))
	wantProblem(t, d.do("GET", "/v1/events", nil, http.Header{"Authorization": {"Bearer wrong-token-0123456789"}}), 401, "unauthorized")
	s := d.subscribe("", true)

	for _, step := range []struct{ method, path string }{
		{"POST", "/v1/sandboxes"},
		{"POST", "/v1/sandboxes/ev-life/start"},
		{"POST", "/v1/sandboxes/ev-life/stop"},
		{"DELETE", "/v1/sandboxes/ev-life"},
	} {
		var body any
		if step.path == "/v1/sandboxes" {
			body = map[string]any{"id": "ev-life"}
		}
		if r := d.doJSON(step.method, step.path, body); r.Status >= 300 {
			t.Fatalf("%s %s: %d %s", step.method, step.path, r.Status, r.Body)
		}
	}
	want := []struct{ typ, state string }{
		{"sandbox.created", "provisioned"},
		{"sandbox.started", "running"},
		{"sandbox.stopped", "stopped"},
		{"sandbox.deleted", ""},
	}
	var seqs []int64
	for _, w := range want {
		e := s.next("ev-life")
		state := ""
		if e.Event.State != nil {
			state = string(*e.Event.State)
		}
		if e.Type != w.typ || string(e.Event.Type) != w.typ || state != w.state {
			t.Fatalf("got %s (data type %s, state %q), want %s %q", e.Type, e.Event.Type, state, w.typ, w.state)
		}
		if e.ID != strconv.FormatInt(e.Event.Seq, 10) || e.Event.At.IsZero() {
			t.Fatalf("event %s: id %q, seq %d, at %v", e.Type, e.ID, e.Event.Seq, e.Event.At)
		}
		seqs = append(seqs, e.Event.Seq)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Fatalf("sequence numbers %v do not increase by one", seqs)
		}
	}

	// A reconnect that saw only the first event is sent the rest.
	again := d.subscribe(strconv.FormatInt(seqs[0], 10), false)
	for _, w := range want[1:] {
		if e := again.next("ev-life"); e.Type != w.typ {
			t.Fatalf("replayed %s, want %s", e.Type, w.typ)
		}
	}

	// A sandbox whose init is killed from the host is reported as exited, with how.
	// Not d.create: its cleanup would call the daemon that this test stops; the sandbox is
	// stopped when the test ends, and its state root goes with the test's.
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "ev-exit", "start": true}); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	if e := s.next("ev-exit"); e.Type != "sandbox.created" {
		t.Fatalf("got %s, want sandbox.created", e.Type)
	}
	if e := s.next("ev-exit"); e.Type != "sandbox.started" {
		t.Fatalf("got %s, want sandbox.started", e.Type)
	}
	d.killInit("ev-exit")
	e := s.next("ev-exit")
	if e.Type != "sandbox.exited" || e.Event.State == nil || *e.Event.State != "stopped" {
		t.Fatalf("after killing the init: %+v", e)
	}
	if e.Event.Exit == nil || e.Event.Exit.Reason != openapi.LastExitReasonKilled {
		t.Fatalf("exit of a killed init: %+v", e.Event.Exit)
	}

	// A graceful shutdown ends open streams (rather than waiting out its grace for them).
	stopped := make(chan struct{})
	go func() { d.Stop(); close(stopped) }()
	deadline := time.After(20 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-s.events:
		case <-deadline:
			t.Fatal("the event stream did not end within 20s of SIGTERM")
		}
	}
	<-stopped
}

// TestEventIDsSurviveRestart: event ids go on increasing across a SIGKILL and restart of
// bothyd, so a client that reconnects with the Last-Event-ID it saw before the restart is
// sent only events it has not seen, each with an id it has never seen.
func TestEventIDsSurviveRestart(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	s := d.subscribe("", false)
	d.create("ev-before", false)
	before := s.next("ev-before")
	d.Restart(true)
	again := d.subscribe(before.ID, false)
	d.create("ev-after", false)
	for {
		e := again.next("ev-after")
		if e.Event.Seq <= before.Event.Seq {
			t.Fatalf("after the restart, event %s (%s) has an id at or below %d, the last seen before it", e.ID, e.Type, before.Event.Seq)
		}
		if e.Type == "sandbox.created" {
			break
		}
	}
}
