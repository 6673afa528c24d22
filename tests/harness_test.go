package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/namespace"
)

// bothydBin and bothyBin are the binaries under test, built once by TestMain.
var bothydBin, bothyBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bothyd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Other users run the binaries too (TestWithoutRoot).
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// BOTHY_TEST_BIN_DIR names a directory of prebuilt bothyd, bothy and bothyd-runtime to
	// test instead: where the tests run without Go (the VM guest of tests/guest).
	if pre := os.Getenv("BOTHY_TEST_BIN_DIR"); pre != "" {
		bothydBin, bothyBin = filepath.Join(pre, "bothyd"), filepath.Join(pre, "bothy")
		code := m.Run()
		os.RemoveAll(dir)
		os.Exit(code)
	}
	bothydBin = filepath.Join(dir, "bothyd")
	bothyBin = filepath.Join(dir, "bothy")
	build := exec.Command("go", "build", "-o", dir, "github.com/bothy/bothy/cmd/bothyd",
		"github.com/bothy/bothy/cmd/bothy")
	// bothyd-runtime beside bothyd, built without cgo as `make build` and the image do:
	// the installed layout (TestSingleBinary covers bothyd alone; the namespace package's
	// own tests cover a runtime that links cgo).
	buildRuntime := exec.Command("go", "build", "-o", dir, "github.com/bothy/bothy/cmd/bothyd-runtime")
	buildRuntime.Env = append(os.Environ(), "CGO_ENABLED=0")
	for _, b := range []*exec.Cmd{build, buildRuntime} {
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building bothyd:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// daemon is one running bothyd.
type daemon struct {
	t     testing.TB
	Root  string
	URL   string
	Token string
	Args  []string

	cmd  *exec.Cmd
	logs *lineLog
	done chan error
	// uid, when not zero, is the user bothyd runs as.
	uid int
	// bin, when set, is the bothyd binary to run instead of bothydBin.
	bin string
	// givenToken says that Token was chosen by the test and is passed with --token-file;
	// otherwise Token is the one bothyd generated into its state root (or none, noAuth).
	givenToken bool
	noAuth     bool
	// netns, when set, is the network namespace bothyd runs in (see inNetNS).
	netns *os.File
	// env is added to bothyd's environment (withEnv).
	env []string
}

type daemonOption func(*daemon)

// withToken configures an API token (written to a 0600 file). Without it, bothyd generates
// its own into the state root, as it does by default, and the daemon's Token is that one.
func withToken(token string) daemonOption {
	return func(d *daemon) { d.Token, d.givenToken = token, true }
}

// withoutAuth runs bothyd with --insecure-no-auth: no token at all.
func withoutAuth() daemonOption {
	return func(d *daemon) { d.noAuth = true; d.Args = append(d.Args, "--insecure-no-auth") }
}

// asUser runs bothyd as another user, with a state root that user owns.
func asUser(uid int) daemonOption { return func(d *daemon) { d.uid = uid } }

// withBinary runs another bothyd binary.
func withBinary(path string) daemonOption { return func(d *daemon) { d.bin = path } }

// withEnv adds variables (NAME=value) to bothyd's environment.
func withEnv(vars ...string) daemonOption {
	return func(d *daemon) { d.env = append(d.env, vars...) }
}

// withArgs adds command-line arguments.
func withArgs(args ...string) daemonOption {
	return func(d *daemon) { d.Args = append(d.Args, args...) }
}

// startDaemon starts bothyd on a free loopback port and waits until /healthz answers.
// It is stopped (gracefully) when the test ends; its log is printed if the test failed.
func startDaemon(t testing.TB, opts ...daemonOption) *daemon {
	t.Helper()
	d := &daemon{t: t}
	for _, o := range opts {
		o(d)
	}
	if d.Root == "" {
		d.Root = filepath.Join(t.TempDir(), "root")
	}
	if d.uid != 0 {
		// t.TempDir is private to root; the user needs a way in to its state root.
		dir := filepath.Dir(d.Root)
		for _, p := range []string{filepath.Dir(dir), dir} {
			if err := os.Chmod(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(dir, d.uid, d.uid); err != nil {
			t.Fatal(err)
		}
	}
	d.start()
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			t.Logf("bothyd log:\n%s", d.logs.String())
		}
		reapSandboxes(t, d.Root)
	})
	return d
}

// in returns the daemon as seen from a subtest: its requests fail t, not the test that started
// the daemon. (A subtest that calls FailNow on its parent ends the parent abruptly, without its
// remaining subtests and with the real failure misreported.) Start, stop and restart the
// daemon through the value startDaemon returned, not through this view.
func (d *daemon) in(t testing.TB) *daemon {
	view := *d
	view.t = t
	return &view
}

func (d *daemon) start() {
	t := d.t
	t.Helper()
	// No spares unless a test asks (withArgs("--spares", …) comes later and wins): a test
	// counts its own sandboxes and processes.
	args := []string{"--listen", "127.0.0.1:0", "--root", d.Root, "--log-format", "json", "--log-level", "debug", "--spares", "0"}
	if d.givenToken {
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte(d.Token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--token-file", tokenFile)
	}
	args = append(args, d.Args...)
	bin := bothydBin
	if d.bin != "" {
		bin = d.bin
	}
	d.cmd = exec.Command(bin, args...)
	if len(d.env) > 0 {
		d.cmd.Env = append(os.Environ(), d.env...)
	}
	if d.uid != 0 {
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(d.uid), Gid: uint32(d.uid)}}
	}
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	d.logs = &lineLog{}
	if err := d.startCmd(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go d.logs.consume(stderr, addr)
	d.done = make(chan error, 1)
	go func() { d.done <- d.cmd.Wait() }()

	select {
	case a := <-addr:
		d.URL = "http://" + a
	case err := <-d.done:
		t.Fatalf("bothyd exited before serving: %v\n%s", err, d.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("bothyd did not report its address within 30s\n%s", d.logs.String())
	}
	waitFor(t, 10*time.Second, "bothyd /healthz", func() bool {
		resp, err := d.httpClient().Get(d.URL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// bothyd serves while its start-up pass reattaches (issue 17), and logs the pass's end
	// whenever it serves (a pass that cannot start ends bothyd). The e2e tests look at
	// sandboxes, networks and processes as a reconciled server leaves them, so they start
	// once the pass is done; the supervisor's tests cover what is served meanwhile.
	waitFor(t, 60*time.Second, "bothyd's start-up reattach pass", func() bool {
		return strings.Contains(d.logs.String(), `"msg":"reattached sandboxes"`)
	})
	if !d.givenToken && !d.noAuth {
		// bothyd made it before it listened; as root the harness can read it whoever owns it.
		b, err := os.ReadFile(filepath.Join(d.Root, "token"))
		if err != nil {
			t.Fatalf("the token bothyd generated: %v", err)
		}
		d.Token = strings.TrimSpace(string(b))
	}
	daemonTokens.Store(d.URL, d.Token)
}

// daemonTokens maps each started daemon's URL to its token, for the helpers that are given a
// URL only (chaosDo, lifecycleCycle).
var daemonTokens sync.Map

// authorize gives req the token of the daemon it is addressed to, if it has one.
func authorize(req *http.Request) {
	base := req.URL.Scheme + "://" + req.URL.Host
	if tok, ok := daemonTokens.Load(base); ok && tok.(string) != "" && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+tok.(string))
	}
}

// LoginURL is the dashboard's one-time login URL that bothyd printed at its last start.
func (d *daemon) LoginURL() string {
	d.t.Helper()
	// It is logged just before bothyd serves, but read from its log by another goroutine.
	waitFor(d.t, 10*time.Second, "the dashboard login URL in bothyd's log", func() bool { return d.logs.loginURL() != "" })
	return d.logs.loginURL()
}

// Stop ends bothyd with SIGTERM and waits for it; it is idempotent.
func (d *daemon) Stop() {
	if d.cmd == nil || d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(45 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		d.t.Errorf("bothyd did not stop within 45s of SIGTERM")
	}
}

// Kill ends bothyd with SIGKILL, as a crash would.
func (d *daemon) Kill() {
	if d.cmd == nil || d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Kill()
	<-d.done
}

// Restart stops bothyd (gracefully, or with SIGKILL) and starts it again on the same root.
func (d *daemon) Restart(kill bool) {
	if kill {
		d.Kill()
	} else {
		d.Stop()
	}
	d.start()
}

// lineLog keeps a process's log lines and reports the serving address when it appears.
type lineLog struct {
	mu    sync.Mutex
	lines []string
	login string // the last dashboard login URL
}

func (l *lineLog) loginURL() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.login
}

func (l *lineLog) consume(r io.Reader, addr chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
			URL  string `json:"url"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "dashboard login" {
			l.mu.Lock()
			l.login = rec.URL
			l.mu.Unlock()
		}
		if !sent && json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "bothyd serving" && rec.Addr != "" {
			addr <- rec.Addr
			sent = true
		}
	}
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	waitCond(t, timeout, what, func() (bool, error) { return cond(), nil })
}

// waitCond polls cond until it holds, failing on its error or at the deadline.
func waitCond(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// response is a finished HTTP exchange.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// problem is the application/problem+json body.
type problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Code      string `json:"code"`
	Field     string `json:"field"`
	RequestID string `json:"request_id"`
}

// do sends a request to the daemon, with its token unless the header is already set.
func (d *daemon) do(method, path string, body io.Reader, header http.Header) response {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, d.URL+path, body)
	if err != nil {
		d.t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if _, set := header["Authorization"]; d.Token != "" && !set {
		req.Header.Set("Authorization", "Bearer "+d.Token)
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := d.httpClient().Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	d.reportContract(req, resp.StatusCode, resp.Header, b)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func (d *daemon) doJSON(method, path string, in any) response {
	d.t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			d.t.Fatal(err)
		}
		body = bytes.NewReader(b)
	}
	return d.do(method, path, body, nil)
}

// wantProblem checks that r is a problem+json response with the status and code.
func wantProblem(t testing.TB, r response, status int, code string) problem {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json (status %d, body %s)", ct, r.Status, r.Body)
	}
	var p problem
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("problem body does not parse: %v: %s", err, r.Body)
	}
	if r.Status != status || p.Status != status || p.Code != code {
		t.Fatalf("got status %d (body status %d) code %q, want %d %q: %s", r.Status, p.Status, p.Code, status, code, r.Body)
	}
	if p.Detail == "" || p.Title == "" || p.Type == "" {
		t.Fatalf("problem lacks detail, title or type: %s", r.Body)
	}
	if p.RequestID == "" || p.RequestID != r.Header.Get("X-Request-Id") {
		t.Fatalf("problem request_id %q does not match X-Request-Id %q", p.RequestID, r.Header.Get("X-Request-Id"))
	}
	return p
}

// reapSandboxes ends every sandbox still running under a state root once its test is over, so
// that a test that failed half-way (or that leaves sandboxes on purpose) leaks no process or
// cgroup onto the machine: sandboxes outlive bothyd by design.
func reapSandboxes(t testing.TB, root string) {
	if os.Geteuid() != 0 {
		return
	}
	// Volumes (docs/volumes.md) stay mounted on the host after bothyd stops, by design: the
	// state root, a temporary directory, could not be removed with them. Detached after the
	// sandboxes that mount them have ended (deferred).
	defer func() {
		if err := platform.UnmountUnder(filepath.Join(root, "volumes")); err != nil {
			t.Logf("detaching the volumes left under %s: %v", root, err)
		}
	}()
	rt, err := namespace.New(namespace.Config{})
	if err != nil {
		return
	}
	procs, err := rt.Processes(root)
	if err != nil {
		t.Logf("listing the sandboxes left under %s: %v", root, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range procs {
		if p.Role != "shim" {
			continue
		}
		if err := rt.Kill(ctx, p.Dir, p.ID); err != nil {
			t.Logf("ending a sandbox left in %s: %v", p.Dir, err)
			continue
		}
		if err := rt.Cleanup(ctx, filepath.Base(p.Dir), p.Dir, p.ID); err != nil {
			t.Logf("cleaning up after a sandbox left in %s: %v", p.Dir, err)
		}
	}
}
