package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// wsSession is a client of the exec websocket.
type wsSession struct {
	t      testing.TB
	conn   *websocket.Conn
	stdout bytes.Buffer
	stderr bytes.Buffer
	exit   *wsExit
}

type wsExit struct {
	Type     string  `json:"type"`
	ExitCode int     `json:"exit_code"`
	Signal   *string `json:"signal"`
	TimedOut bool    `json:"timed_out"`
}

// dialStream opens an exec websocket; it returns the HTTP response when the server refused
// the upgrade.
func (d *daemon) dialStream(id string, q url.Values) (*wsSession, *http.Response, error) {
	u := strings.Replace(d.URL, "http://", "ws://", 1) + "/v1/sandboxes/" + id + "/exec/stream?" + q.Encode()
	h := http.Header{}
	if d.Token != "" {
		h.Set("Authorization", "Bearer "+d.Token)
	}
	conn, resp, err := websocket.DefaultDialer.Dial(u, h)
	d.reportDial(u, resp)
	if err != nil {
		return nil, resp, err
	}
	return &wsSession{t: d.t, conn: conn}, resp, nil
}

func (s *wsSession) send(data string) {
	s.t.Helper()
	if err := s.conn.WriteMessage(websocket.BinaryMessage, append([]byte{0}, data...)); err != nil {
		s.t.Fatal(err)
	}
}

func (s *wsSession) control(m map[string]any) {
	s.t.Helper()
	b, _ := json.Marshal(m)
	if err := s.conn.WriteMessage(websocket.TextMessage, b); err != nil {
		s.t.Fatal(err)
	}
}

// readUntil reads frames until stdout contains want, or the exit arrives.
func (s *wsSession) readUntil(want string) {
	s.t.Helper()
	for !strings.Contains(s.stdout.String(), want) {
		if s.next() {
			s.t.Fatalf("the stream ended before %q appeared; stdout %q", want, s.stdout.String())
		}
	}
}

// wait reads frames until the exit message and the normal close.
func (s *wsSession) wait() *wsExit {
	s.t.Helper()
	for !s.next() {
	}
	if s.exit == nil {
		s.t.Fatalf("the stream closed without an exit message; stdout %q", s.stdout.String())
	}
	return s.exit
}

// next reads one frame; it reports true once the connection closed.
func (s *wsSession) next() bool {
	s.t.Helper()
	_ = s.conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	kind, data, err := s.conn.ReadMessage()
	if err != nil {
		if !websocket.IsCloseError(err, websocket.CloseNormalClosure) {
			s.t.Fatalf("the stream ended with %v; stdout so far %q", err, s.stdout.String())
		}
		return true
	}
	switch kind {
	case websocket.BinaryMessage:
		if len(data) == 0 {
			s.t.Fatalf("an empty binary frame")
		}
		switch data[0] {
		case 1:
			s.stdout.Write(data[1:])
		case 2:
			s.stderr.Write(data[1:])
		default:
			s.t.Fatalf("a frame of stream %d", data[0])
		}
	case websocket.TextMessage:
		var e wsExit
		if err := json.Unmarshal(data, &e); err != nil || e.Type != "exit" {
			s.t.Fatalf("unexpected control message %s", data)
		}
		s.exit = &e
	}
	return false
}

func TestStreamInteractiveShell(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("ws", true)

	s, _, err := d.dialStream("ws", url.Values{"command": {"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	s.send("echo hello $((6*7))\n")
	s.readUntil("hello 42\n")
	s.send("echo oops >&2; exit 7\n")
	exit := s.wait()
	if exit.ExitCode != 7 || s.stderr.String() != "oops\n" {
		t.Fatalf("exit %+v, stderr %q", exit, s.stderr.String())
	}

	t.Run("eof closes stdin", func(t *testing.T) {
		d := d.in(t)
		s, _, err := d.dialStream("ws", url.Values{"command": {"wc", "-c"}})
		if err != nil {
			t.Fatal(err)
		}
		s.send("12345")
		s.control(map[string]any{"type": "eof"})
		if exit := s.wait(); exit.ExitCode != 0 || strings.TrimSpace(s.stdout.String()) != "5" {
			t.Fatalf("exit %+v, stdout %q", exit, s.stdout.String())
		}
	})
}

func TestStreamTTYAndResize(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("tty", true)
	s, _, err := d.dialStream("tty", url.Values{"command": {"sh"}, "tty": {"true"}, "rows": {"10"}, "cols": {"40"}})
	if err != nil {
		t.Fatal(err)
	}
	s.send("test -t 0 && echo IS-A-TTY; stty size\n")
	s.readUntil("IS-A-TTY")
	s.readUntil("10 40")
	s.control(map[string]any{"type": "resize", "rows": 30, "cols": 100})
	s.send("stty size\n")
	s.readUntil("30 100")
	s.send("exit 0\n")
	if exit := s.wait(); exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
}

func TestStreamSignalEndsWorkload(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("sig", true)
	s, _, err := d.dialStream("sig", url.Values{"command": {"sh", "-c", "echo ready; exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	s.readUntil("ready")
	s.control(map[string]any{"type": "signal", "signal": "SIGTERM"})
	exit := s.wait()
	if exit.Signal == nil || *exit.Signal != "SIGTERM" {
		t.Fatalf("exit %+v, want signal SIGTERM", exit)
	}
}

func TestStreamLargeOutputInOrder(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("big", true)
	const n = 300000
	s, _, err := d.dialStream("big", url.Values{"command": {"seq", "1", strconv.Itoa(n)}})
	if err != nil {
		t.Fatal(err)
	}
	if exit := s.wait(); exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
	var want strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if s.stdout.String() != want.String() {
		t.Fatalf("stdout is %d bytes and differs from seq's %d bytes", s.stdout.Len(), want.Len())
	}
}

// TestStreamBothStreamsInterleaved: stdout and stderr flooding at once arrive whole, each in
// order, each on its own stream, through the one relay that carries both.
func TestStreamBothStreamsInterleaved(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("both", true)
	const nOut, nErr = 400000, 300000
	s, _, err := d.dialStream("both", url.Values{"command": {"sh", "-c",
		fmt.Sprintf("seq 1 %d >&2 & seq 1 %d; wait", nErr, nOut)}})
	if err != nil {
		t.Fatal(err)
	}
	if exit := s.wait(); exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
	seq := func(n int) string {
		var b strings.Builder
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&b, "%d\n", i)
		}
		return b.String()
	}
	if s.stdout.String() != seq(nOut) {
		t.Errorf("stdout is %d bytes and differs from seq's", s.stdout.Len())
	}
	if s.stderr.String() != seq(nErr) {
		t.Errorf("stderr is %d bytes and differs from seq's", s.stderr.Len())
	}
}

// TestStreamStdoutSkipsTheAgent: a workload's stdout is a pipe whose read end bothyd holds
// (the agent passed it on and never reads it), while stderr stays the agent's; a background
// process that keeps stdout open and silent does not hold the stream open once the workload
// exited, and what it prints later is not part of the stream.
func TestStreamStdoutSkipsTheAgent(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("pipe", true)
	s, _, err := d.dialStream("pipe", url.Values{"command": {"sh", "-c",
		"readlink /proc/self/fd/1 /proc/self/fd/2; echo listed; read line"}})
	if err != nil {
		t.Fatal(err)
	}
	s.readUntil("listed\n")
	links := strings.Fields(s.stdout.String())
	if len(links) < 2 || !strings.HasPrefix(links[0], "pipe:[") || !strings.HasPrefix(links[1], "pipe:[") {
		t.Fatalf("the workload's stdout and stderr are %q, not two pipes", links)
	}
	held := bothydPipes(t, d)
	if !held[links[0]] {
		t.Errorf("bothyd does not hold the workload's stdout pipe %s", links[0])
	}
	if held[links[1]] {
		t.Errorf("bothyd holds the workload's stderr pipe %s, which is the agent's", links[1])
	}
	s.send("go\n")
	if exit := s.wait(); exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}

	s, _, err = d.dialStream("pipe", url.Values{"command": {"sh", "-c",
		"echo first; (sleep 5; echo late) & echo second"}})
	if err != nil {
		t.Fatal(err)
	}
	if exit := s.wait(); exit.ExitCode != 0 || s.stdout.String() != "first\nsecond\n" {
		t.Fatalf("exit %+v, stdout %q; want 0 and the two lines before the exit", exit, s.stdout.String())
	}
}

// bothydPipes returns the pipes bothyd's process holds, as /proc names them ("pipe:[N]").
func bothydPipes(t *testing.T, d *daemon) map[string]bool {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pipes := map[string]bool{}
	for _, e := range entries {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(l, "pipe:[") {
			pipes[l] = true
		}
	}
	return pipes
}

// TestStreamRefusalsAreProblems: validation and admission happen before the upgrade.
func TestStreamRefusalsAreProblems(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("idle", false)
	d.create("held", true)
	for _, c := range []struct {
		id     string
		q      url.Values
		status int
		code   string
	}{
		{"nope", url.Values{"command": {"true"}}, 404, "sandbox-not-found"},
		{"idle", url.Values{"command": {"true"}}, 409, "not-running"},
		{"held", url.Values{}, 400, "invalid-request"},
		{"held", url.Values{"command": {"true"}, "rows": {"0"}}, 400, "invalid-request"},
		{"held", url.Values{"command": {"true"}, "timeout_ms": {"0"}}, 400, "invalid-request"},
	} {
		_, resp, err := d.dialStream(c.id, c.q)
		if err == nil || resp == nil {
			t.Fatalf("%s %v: the upgrade succeeded", c.id, c.q)
		}
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		resp.Body.Close()
		wantProblem(t, response{Status: resp.StatusCode, Header: resp.Header, Body: buf.Bytes()}, c.status, c.code)
	}

	// While a stream holds the exec lock, another with a short wait is refused before upgrade.
	s, _, err := d.dialStream("held", url.Values{"command": {"sh", "-c", "echo in; sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	s.readUntil("in")
	_, resp, err := d.dialStream("held", url.Values{"command": {"true"}, "wait_ms": {"50"}})
	if err == nil {
		t.Fatal("a second stream was admitted while the first held the exec lock")
	}
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	resp.Body.Close()
	wantProblem(t, response{Status: resp.StatusCode, Header: resp.Header, Body: buf.Bytes()}, 423, "sandbox-busy")

	// Dropping the client kills its workload and frees the exec lock.
	s.conn.Close()
	got := d.exec("held", map[string]any{"command": []string{"sh", "-c", "for i in $(seq 100); do pgrep -f 'slee[p] 1000' >/dev/null || { echo none; exit; }; sleep 0.05; done; echo still running"}, "wait_ms": 20000})
	if strings.TrimSpace(got.Stdout) != "none" {
		t.Fatalf("the dropped client's workload still runs: %q", got.Stdout)
	}
}
