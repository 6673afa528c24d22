package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// fake is a bothyd stand-in that records the requests it gets.
type fake struct {
	mu   sync.Mutex
	reqs []string // "METHOD /path?query body"
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+string(body)))
	f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer tok" {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(401)
		_, _ = io.WriteString(w, `{"status":401,"code":"unauthorized","detail":"A token is needed.","title":"x","type":"x"}`)
		return
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/nope") || strings.Contains(r.URL.Path, "/nope/"):
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(404)
		_, _ = io.WriteString(w, `{"status":404,"code":"sandbox-not-found","detail":"There is no sandbox nope.","title":"x","type":"x"}`)
	case strings.HasSuffix(r.URL.Path, "/exec"):
		_, _ = io.WriteString(w, `{"exit_code":7,"stdout":"out\n","stderr":"","stdout_truncated":false,"stderr_truncated":false,"timed_out":false,"duration_ms":1}`)
	case r.URL.Path == "/v1/sandboxes" && r.Method == http.MethodGet:
		_, _ = io.WriteString(w, `{"items":[{"id":"a","state":"running","image":"host","labels":{},"resources":{"vcpus":1,"memory_mb":256,"pids":64,"disk_mb":0},"created_at":"2026-01-01T00:00:00Z"}]}`)
	default:
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "cli3", "state": "stopped", "created_at": time.Now()})
	}
}

func (f *fake) last() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) == 0 {
		return ""
	}
	return f.reqs[len(f.reqs)-1]
}

func ctl(t *testing.T, url string, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(append([]string{"--url", url, "--token", "tok"}, args...), strings.NewReader(""), &out, &errOut)
	return out.String(), errOut.String(), code
}

// TestFlagsAnywhere: flags after the positional arguments are flags, as before them; what
// follows "--" is the command's own.
func TestFlagsAnywhere(t *testing.T) {
	f := &fake{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"stop, flag after", []string{"stop", "cli3", "--force"}, "POST /v1/sandboxes/cli3/stop?force=true"},
		{"stop, flag before", []string{"stop", "-f", "cli3"}, "POST /v1/sandboxes/cli3/stop?force=true"},
		{"exec, flags after the id", []string{"exec", "cli3", "--user", "root", "--buffered", "--", "id", "-u"},
			`POST /v1/sandboxes/cli3/exec {"command":["id","-u"],"user":"root"}`},
		{"create with the id", []string{"create", "cli2", "--label", "a=b", "--memory", "1g", "--start"},
			`POST /v1/sandboxes {"id":"cli2","resources":{"memory_mb":1024},"labels":{"a":"b"},"start":true}`},
		{"ls filters", []string{"ls", "--state", "running", "-l", "a=b"}, "GET /v1/sandboxes?label=a%3Db&state=running"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := ctl(t, srv.URL, tc.args...)
			if got := f.last(); got != tc.want {
				t.Fatalf("request %q, want %q (exit %d, %s)", got, tc.want, code, stderr)
			}
		})
	}
}

func TestExitCodesAndErrors(t *testing.T) {
	f := &fake{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	if out, _, code := ctl(t, srv.URL, "exec", "--buffered", "a", "--", "x"); code != 7 || out != "out\n" {
		t.Fatalf("exec's own exit code: %d %q", code, out)
	}
	_, stderr, code := ctl(t, srv.URL, "start", "nope")
	if code != exitFailure || strings.Count(stderr, "There is no sandbox nope.") != 1 || !strings.Contains(stderr, "sandbox-not-found") {
		t.Fatalf("an API error: exit %d, %q", code, stderr)
	}
	for _, args := range [][]string{{"stop", "--bogus", "x"}, {"nope"}, {"stop"}, {"ls", "-o", "yaml"}, {"create", "--memory", "lots"}} {
		if _, stderr, code := ctl(t, srv.URL, args...); code != exitUsage || strings.Count(stderr, "error:") != 1 {
			t.Fatalf("%v: exit %d, %q", args, code, stderr)
		}
	}
	out, _, code := ctl(t, srv.URL, "ls", "-o", "json")
	var list []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0]["id"] != "a" {
		t.Fatalf("ls -o json: %d %q", code, out)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	if _, stderr, code := ctl(t, closed, "ls"); code != exitFailure || !strings.Contains(stderr, "is bothyd running?") {
		t.Fatalf("no server: exit %d, %q", code, stderr)
	}
}

// TestHelp: --help exits 0 on every command, and says what the exit codes are.
func TestHelp(t *testing.T) {
	c := &cli{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	var walk func(cmd *cobra.Command)
	paths := [][]string{}
	walk = func(cmd *cobra.Command) {
		p := strings.Fields(cmd.CommandPath())[1:]
		paths = append(paths, p)
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(c.rootCommand())
	for _, p := range paths {
		var out bytes.Buffer
		if code := run(append(p, "--help"), strings.NewReader(""), &out, io.Discard); code != 0 || !strings.Contains(out.String(), "Usage:") {
			t.Fatalf("%v --help: exit %d\n%s", p, code, out.String())
		}
	}
	var out bytes.Buffer
	if run([]string{"--help"}, nil, &out, io.Discard); !strings.Contains(out.String(), "Exit codes:") {
		t.Fatalf("the exit codes are not in --help:\n%s", out.String())
	}
}

// TestNodeCommands: bothy node's subcommands send the nodes API's calls, and a single
// bothyd's not-a-cluster comes back as a readable failure.
func TestNodeCommands(t *testing.T) {
	var mu sync.Mutex
	var reqs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		reqs = append(reqs, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+string(body)))
		mu.Unlock()
		const n = `{"name":"node-a","live":true,"health":"Healthy","cordoned":true,"draining":false,"sandboxes":2,"version":"v1",` +
			`"capacity":{"memory_mb":4096,"milli_cpu":8000,"sandboxes":10},"allocated":{"memory_mb":1024,"milli_cpu":2000,"sandboxes":2},` +
			`"free":{"memory_mb":3072,"milli_cpu":6000,"sandboxes":8}}`
		switch r.URL.Path {
		case "/v1/nodes/single":
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(501)
			_, _ = io.WriteString(w, `{"status":501,"code":"not-a-cluster","detail":"This bothyd is not a cluster router.","title":"x","type":"x"}`)
		case "/v1/nodes":
			_, _ = io.WriteString(w, `{"items":[`+n+`]}`)
		default:
			_, _ = io.WriteString(w, n)
		}
	}))
	defer srv.Close()
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		return reqs[len(reqs)-1]
	}
	out, stderr, code := ctl(t, srv.URL, "node", "ls")
	if code != 0 || !strings.Contains(out, "node-a") || !strings.Contains(out, "cordoned") || !strings.Contains(out, "8/10") {
		t.Fatalf("node ls: %d %q %q", code, out, stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "inspect", "node-a"}, "GET /v1/nodes/node-a"},
		{[]string{"node", "cordon", "node-a"}, `PATCH /v1/nodes/node-a {"cordoned":true}`},
		{[]string{"node", "uncordon", "node-a"}, `PATCH /v1/nodes/node-a {"cordoned":false}`},
		{[]string{"node", "drain", "node-a"}, `PATCH /v1/nodes/node-a {"draining":true}`},
		{[]string{"node", "drain", "node-a", "--cancel"}, `PATCH /v1/nodes/node-a {"drain_deadline":null,"draining":false}`},
	} {
		if _, stderr, code := ctl(t, srv.URL, tc.args...); code != 0 || last() != tc.want {
			t.Fatalf("%v: exit %d %q, sent %q, want %q", tc.args, code, stderr, last(), tc.want)
		}
	}
	if _, stderr, code := ctl(t, srv.URL, "node", "drain", "node-a", "--deadline", "2h"); code != 0 || !strings.Contains(last(), `"draining":true`) || !strings.Contains(last(), `"drain_deadline":"`) {
		t.Fatalf("drain with a deadline: exit %d %q, sent %q", code, stderr, last())
	}
	if _, stderr, code := ctl(t, srv.URL, "node", "inspect", "single"); code != exitFailure || !strings.Contains(stderr, "not-a-cluster") {
		t.Fatalf("a single bothyd: exit %d %q", code, stderr)
	}
}
