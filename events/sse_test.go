package events

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/openapi"
)

// sseEvent is one parsed server-sent event.
type sseEvent struct {
	id, typ string
	data    openapi.Event
}

// readSSE parses a stream, sending events and comment lines as they come.
func readSSE(t *testing.T, body *bufio.Reader, events chan<- sseEvent, comments chan<- string) {
	var cur sseEvent
	for {
		line, err := body.ReadString('\n')
		if err != nil {
			close(events)
			return
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if cur.typ != "" {
				events <- cur
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
			select {
			case comments <- line:
			default:
			}
		case strings.HasPrefix(line, "id: "):
			cur.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.typ = line[7:]
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(line[6:]), &cur.data); err != nil {
				t.Errorf("data does not parse: %v: %s", err, line)
			}
		}
	}
}

func open(t *testing.T, url string, lastID string) (<-chan sseEvent, <-chan string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, ct)
	}
	events, comments := make(chan sseEvent, 16), make(chan string, 16)
	go readSSE(t, bufio.NewReader(resp.Body), events, comments)
	return events, comments, func() { cancel(); _ = resp.Body.Close() }
}

func recv(t *testing.T, c <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case e, ok := <-c:
		if !ok {
			t.Fatal("the stream ended")
		}
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	panic("unreachable")
}

func TestServeEvents(t *testing.T) {
	t.Parallel()
	bus := New(Options{})
	h := &Handler{Bus: bus, Heartbeat: 50 * time.Millisecond}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeEvents(w, r); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}))
	defer srv.Close()

	events, comments, stop := open(t, srv.URL, "")
	id := "box-1"
	bus.Publish(openapi.Event{Type: "sandbox.created", Sandbox: &id})
	bus.Publish(openapi.Event{Type: "sandbox.started", Sandbox: &id})
	for i, want := range []string{"sandbox.created", "sandbox.started"} {
		e := recv(t, events)
		if e.typ != want || e.id != string(rune('1'+i)) || e.data.Seq != int64(i+1) || *e.data.Sandbox != id {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	// An idle stream gets heartbeats.
	deadline := time.After(5 * time.Second)
	for got := false; !got; {
		select {
		case c := <-comments:
			got = c == ": ping"
		case <-deadline:
			t.Fatal("no heartbeat within 5s")
		}
	}
	stop()

	// Reconnecting with the last id replays what was missed, then goes on live.
	bus.Publish(openapi.Event{Type: "sandbox.stopped", Sandbox: &id})
	events, _, stop = open(t, srv.URL, "2")
	defer stop()
	if e := recv(t, events); e.typ != "sandbox.stopped" || e.id != "3" {
		t.Fatalf("replayed %+v", e)
	}
	bus.Publish(openapi.Event{Type: "sandbox.deleted", Sandbox: &id})
	if e := recv(t, events); e.typ != "sandbox.deleted" || e.id != "4" {
		t.Fatalf("live after replay: %+v", e)
	}

	// Closing the bus (a server shutdown) ends the stream.
	bus.Close()
	select {
	case _, ok := <-events:
		if ok {
			t.Fatal("an event after the bus closed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end when the bus closed")
	}
}

// A Last-Event-ID this server did not send is ignored: the stream starts from now.
func TestServeEventsIgnoresAForeignLastEventID(t *testing.T) {
	t.Parallel()
	bus := New(Options{})
	id := "box-1"
	bus.Publish(openapi.Event{Type: "sandbox.created", Sandbox: &id})
	h := &Handler{Bus: bus}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeEvents(w, r); err != nil {
			t.Errorf("ServeEvents: %v", err)
		}
	}))
	defer srv.Close()
	events, _, stop := open(t, srv.URL, "x1")
	defer stop()
	bus.Publish(openapi.Event{Type: "sandbox.started", Sandbox: &id})
	if e := recv(t, events); e.typ != "sandbox.started" || e.id != "2" {
		t.Fatalf("got %+v, want the live event 2 only", e)
	}
}
