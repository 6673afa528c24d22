package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// fakeWorkload writes its output, then waits for end-of-file on its stdin (or to be killed)
// before it ends with status or waitErr.
type fakeWorkload struct {
	output  []string // "1..." for stdout, "2..." for stderr
	status  supervisor.ExitStatus
	waitErr error

	mu      sync.Mutex
	stdin   strings.Builder
	events  []string
	end     chan struct{}
	endOnce sync.Once
}

func newFakeWorkload(output ...string) *fakeWorkload {
	return &fakeWorkload{output: output, end: make(chan struct{})}
}

func (w *fakeWorkload) record(e string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, e)
}

func (w *fakeWorkload) WriteStdin(p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stdin.Write(p)
	return nil
}

func (w *fakeWorkload) CloseStdin() error {
	w.record("eof")
	w.endOnce.Do(func() { close(w.end) })
	return nil
}

func (w *fakeWorkload) Resize(rows, cols uint16) error {
	w.record(fmt.Sprintf("resize %dx%d", rows, cols))
	return nil
}

func (w *fakeWorkload) Signal(name string) error { w.record("signal " + name); return nil }

func (w *fakeWorkload) ReadOutput(p []byte) (supervisor.Stream, int, error) {
	if len(w.output) > 0 {
		o := w.output[0]
		w.output = w.output[1:]
		s := supervisor.Stdout
		if o[0] == '2' {
			s = supervisor.Stderr
		}
		return s, copy(p, o[1:]), nil
	}
	<-w.end
	return 0, 0, io.EOF
}

func (w *fakeWorkload) Wait() (supervisor.ExitStatus, error) { return w.status, w.waitErr }

func (w *fakeWorkload) Close() error {
	w.record("killed")
	w.endOnce.Do(func() { close(w.end) })
	return nil
}

// streamTo serves work over a websocket and dials it; done has runStream's answer.
func streamTo(t *testing.T, work *fakeWorkload) (conn *websocket.Conn, done <-chan error) {
	t.Helper()
	result := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			result <- err
			return
		}
		timedOut, err := runStream(c, work, slog.New(slog.DiscardHandler))
		if err == nil && timedOut != work.status.TimedOut {
			err = errors.New("runStream misreported the timeout")
		}
		result <- err
	}))
	t.Cleanup(srv.Close)
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, result
}

// TestRunStream: output goes out in order with its stream byte; stdin and control messages
// reach the workload; its exit is the last message, then a normal close.
func TestRunStream(t *testing.T) {
	t.Parallel()
	work := newFakeWorkload("1out", "2err", "1more")
	work.status = supervisor.ExitStatus{ExitCode: 143, Signal: "TERM", TimedOut: true}
	conn, done := streamTo(t, work)
	for _, want := range []string{"\x01out", "\x02err", "\x01more"} {
		kind, data, err := conn.ReadMessage()
		if err != nil || kind != websocket.BinaryMessage || string(data) != want {
			t.Fatalf("read %d %q %v, want %q", kind, data, err, want)
		}
	}
	send := func(kind int, data string) {
		if err := conn.WriteMessage(kind, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	send(websocket.BinaryMessage, "\x00typed")
	send(websocket.BinaryMessage, "\x01not stdin")
	send(websocket.TextMessage, `{"type":"resize","rows":30,"cols":99}`)
	send(websocket.TextMessage, `{"type":"resize","rows":0,"cols":99}`)
	send(websocket.TextMessage, `not json`)
	send(websocket.TextMessage, `{"type":"signal","signal":"SIGINT"}`)
	send(websocket.TextMessage, `{"type":"signal","signal":"SIGNOPE"}`)
	send(websocket.TextMessage, `{"type":"bogus"}`)
	send(websocket.TextMessage, `{"type":"eof"}`)

	// Each frame the server could not act on is answered with an error message, in order,
	// and the session goes on.
	for _, want := range []string{"stream byte 0", "rows and cols", "JSON control message", "unknown signal", "unknown control message type"} {
		kind, data, err := conn.ReadMessage()
		var e map[string]any
		if err != nil || kind != websocket.TextMessage || json.Unmarshal(data, &e) != nil ||
			e["type"] != "error" || e["code"] != "invalid-request" || !strings.Contains(e["detail"].(string), want) {
			t.Fatalf("error message: %d %q %v, want one saying %q", kind, data, err, want)
		}
	}
	kind, data, err := conn.ReadMessage()
	var exit map[string]any
	if err != nil || kind != websocket.TextMessage || json.Unmarshal(data, &exit) != nil {
		t.Fatalf("exit message: %d %q %v", kind, data, err)
	}
	if exit["type"] != "exit" || exit["exit_code"] != 143.0 || exit["signal"] != "SIGTERM" || exit["timed_out"] != true {
		t.Errorf("exit message %s", data)
	}
	_, _, err = conn.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
		t.Errorf("after the exit: %v, want a normal close", err)
	}
	if err := <-done; err != nil {
		t.Errorf("runStream: %v", err)
	}
	work.mu.Lock()
	defer work.mu.Unlock()
	if work.stdin.String() != "typed" {
		t.Errorf("stdin %q", work.stdin.String())
	}
	if got := strings.Join(work.events, ", "); !strings.HasPrefix(got, "resize 30x99, signal SIGINT, eof") {
		t.Errorf("the workload saw %s", got)
	}
}

// TestRunStreamLost: a workload that ends without a status closes the stream with a code
// that says why: going away with not-running when its sandbox stopped, internal otherwise.
func TestRunStreamLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		code   int
		reason string
	}{
		{errcode.New(errcode.NotRunning, "Sandbox a1 stopped."), websocket.CloseGoingAway, "not-running"},
		{errors.New("control: the exec ended without an exit status"), websocket.CloseInternalServerErr, "internal"},
	} {
		work := newFakeWorkload("1partial")
		work.waitErr = tc.err
		conn, done := streamTo(t, work)
		if _, data, err := conn.ReadMessage(); err != nil || string(data) != "\x01partial" {
			t.Fatalf("output %q, %v", data, err)
		}
		if err := conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"eof"}`)); err != nil {
			t.Fatal(err)
		}
		_, _, err := conn.ReadMessage()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != tc.code || ce.Text != tc.reason {
			t.Errorf("%v: closed with %v, want %d %s", tc.err, err, tc.code, tc.reason)
		}
		if err := <-done; err != tc.err {
			t.Errorf("runStream: %v, want %v", err, tc.err)
		}
	}
}

// TestRunStreamClientGone: a client that goes away kills its workload.
func TestRunStreamClientGone(t *testing.T) {
	t.Parallel()
	work := newFakeWorkload()
	work.waitErr = errors.New("killed")
	conn, done := streamTo(t, work)
	conn.Close()
	<-done // the test's own timeout catches a stream that never ends
	work.mu.Lock()
	defer work.mu.Unlock()
	if len(work.events) == 0 || work.events[0] != "killed" {
		t.Errorf("the workload saw %q, want it killed", work.events)
	}
}
