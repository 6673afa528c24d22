package tests

import (
	"bufio"
	"bytes"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrape reads /metrics into sample lines keyed by name and labels as exposed, e.g.
// `bothy_sandboxes{state="running"}`.
func (d *daemon) scrape() map[string]float64 {
	d.t.Helper()
	r := d.do("GET", "/metrics", nil, nil)
	if r.Status != http.StatusOK {
		d.t.Fatalf("GET /metrics: %d %s", r.Status, r.Body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			d.t.Fatalf("a sample that does not parse: %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetricsFollowState: the scraped values change as a sandbox changes state, runs execs,
// is refused as busy and answers errors; /metrics needs the token like the API.
func TestMetricsFollowState(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withToken("metrics-test-token-0123456789"))
	wantProblem(t, d.do("GET", "/metrics", nil, http.Header{"Authorization": {""}}), 401, "unauthorized")

	running, stopped := `bothy_sandboxes{state="running"}`, `bothy_sandboxes{state="stopped"}`
	m := d.scrape()
	if m[running] != 0 || m[stopped] != 0 {
		t.Fatalf("before any sandbox: running %v, stopped %v", m[running], m[stopped])
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := m[name]; !ok {
			t.Fatalf("the scrape lacks %s", name)
		}
	}

	d.create("mx", true)
	m = d.scrape()
	if m[running] != 1 {
		t.Fatalf("running after a start: %v", m[running])
	}
	if n := m[`bothy_transition_duration_seconds_count{op="start",result="ok"}`]; n != 1 {
		t.Fatalf("start transitions counted: %v", n)
	}

	d.exec("mx", map[string]any{"command": []string{"true"}})
	// A stream holds the exec lock while a buffered exec waits out its wait_ms: sandbox-busy.
	s, _, err := d.dialStream("mx", url.Values{"command": {"/bin/sh"}, "access_token": {d.Token}})
	if err != nil {
		t.Fatal(err)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/mx/exec", map[string]any{"command": []string{"true"}, "wait_ms": 50}), 423, "sandbox-busy")
	s.send("exit 0\n")
	s.wait()

	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/mx/start", nil), 409, "already-running")
	if r := d.doJSON("POST", "/v1/sandboxes/mx/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	// The stream's handler records it just after the connection closes.
	waitFor(t, 10*time.Second, "the stream exec to be counted", func() bool {
		m = d.scrape()
		return m[`bothy_execs_total{mode="stream",result="ok"}`] == 1
	})
	want := map[string]float64{
		running: 0,
		stopped: 1,
		`bothy_execs_total{mode="buffered",result="ok"}`:                           1,
		`bothy_execs_total{mode="stream",result="ok"}`:                             1,
		`bothy_exec_busy_total`:                                                    1,
		`bothy_exec_admission_wait_seconds_count{result="sandbox-busy"}`:           1,
		`bothy_exec_admission_wait_seconds_count{result="ok"}`:                     2,
		`bothy_http_errors_total{code="sandbox-busy",status="423"}`:                1,
		`bothy_http_errors_total{code="already-running",status="409"}`:             1,
		`bothy_transition_duration_seconds_count{op="stop",result="ok"}`:           1,
		`bothy_events_total{type="sandbox.stopped"}`:                               1,
		`bothy_http_errors_total{code="unauthorized",status="401"}`:                1,
		`bothy_transition_duration_seconds_count{op="provision",result="ok"}`:      1,
		`bothy_transition_duration_seconds_count{op="exec-admission",result="ok"}`: 2,
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
}
