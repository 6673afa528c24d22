package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lifecycleJSON is the part of a Sandbox the lifecycle tests look at.
type lifecycleJSON struct {
	ID        string     `json:"id"`
	State     string     `json:"state"`
	ExpiresAt *time.Time `json:"expires_at"`
	OnTimeout *string    `json:"on_timeout"`
	LastExit  *struct {
		Reason string `json:"reason"`
	} `json:"last_exit"`
}

// TestForcedDelete: DELETE ?force=true kills a running sandbox and removes it in one call;
// without force it is refused; nothing of it is left.
func TestForcedDelete(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("rmf", true)
	wantProblem(t, d.doJSON("DELETE", "/v1/sandboxes/rmf", nil), 409, "sandbox-launched")
	if r := d.doJSON("DELETE", "/v1/sandboxes/rmf?force=true", nil); r.Status != 204 {
		t.Fatalf("forced delete: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/rmf", nil, nil), 404, "sandbox-not-found")
	if procs := runtimeProcesses(t, d.Root); len(procs) != 0 {
		t.Fatalf("runtime processes after the forced delete: %v", procs)
	}
	// The id is free: a new sandbox of the same id starts. A forced stop of it says killed.
	d.create("rmf", true)
	sb := decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/rmf/stop?force=true", nil), 200)
	if sb.LastExit == nil || sb.LastExit.Reason != "killed" {
		t.Fatalf("last_exit after a forced stop: %+v", sb.LastExit)
	}
}

// TestCreateStartAllOrNothing: a create with start whose start fails answers the start's
// error and leaves no sandbox: the id is free again.
func TestCreateStartAllOrNothing(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--runtime-binary", "/bin/false"))
	r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "aon", "start": true})
	wantProblem(t, r, 504, "start-timeout")
	wantProblem(t, d.do("GET", "/v1/sandboxes/aon", nil, nil), 404, "sandbox-not-found")
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "aon"}); r.Status != 201 {
		t.Fatalf("a create of the same id after the failed one: %d %s", r.Status, r.Body)
	}
}

// TestPauseResume: a paused sandbox refuses exec, files and the stream with sandbox-paused,
// stays paused across a SIGKILL and restart of bothyd, resumes, and stops while paused.
func TestPauseResume(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("nap", true)
	d.exec("nap", map[string]any{"command": []string{"sh", "-c", "echo before > /home/user/mark"}})
	sb := decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/nap/pause", nil), 200)
	if sb.State != "paused" {
		t.Fatalf("state after pause: %s", sb.State)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/nap/exec", map[string]any{"command": []string{"true"}}), 409, "sandbox-paused")
	wantProblem(t, d.do("GET", "/v1/sandboxes/nap/files?path=/home/user/mark", nil, nil), 409, "sandbox-paused")
	_, resp, err := d.dialStream("nap", url.Values{"command": {"true"}})
	if err == nil || resp == nil {
		t.Fatal("a stream on a paused sandbox was upgraded")
	}
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	resp.Body.Close()
	wantProblem(t, response{Status: resp.StatusCode, Header: resp.Header, Body: buf.Bytes()}, 409, "sandbox-paused")
	// Pausing again answers it as it is.
	if sb := decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/nap/pause", nil), 200); sb.State != "paused" {
		t.Fatalf("a second pause: %s", sb.State)
	}

	d.Restart(true)
	if sb := decode[lifecycleJSON](t, d.do("GET", "/v1/sandboxes/nap", nil, nil), 200); sb.State != "paused" {
		t.Fatalf("state after a restart of bothyd: %s", sb.State)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/nap/exec", map[string]any{"command": []string{"true"}}), 409, "sandbox-paused")
	if r := mustCheckClean(t, d.Root, "while paused"); r.Paused != 1 || r.Running != 1 {
		t.Fatalf("bothyd check while paused: %d running, %d paused; want 1 and 1", r.Running, r.Paused)
	}
	if sb := decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/nap/resume", nil), 200); sb.State != "running" {
		t.Fatalf("state after resume: %s", sb.State)
	}
	if got := d.exec("nap", map[string]any{"command": []string{"cat", "/home/user/mark"}}); got.Stdout != "before\n" {
		t.Fatalf("exec after resume: %+v", got)
	}

	decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/nap/pause", nil), 200)
	if sb := decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/nap/stop", nil), 200); sb.State != "stopped" {
		t.Fatalf("stop of a paused sandbox: %s", sb.State)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/nap/pause", nil), 409, "not-running")
	if procs := runtimeProcesses(t, d.Root); len(procs) != 0 {
		t.Fatalf("runtime processes after the stop: %v", procs)
	}
	mustCheckClean(t, d.Root, "after the stop of a paused sandbox")
}

// TestExecOutlivesAPause: an exec that runs when its sandbox is paused finishes once the
// sandbox resumes, with its output, however long the pause; it used to fail after 30 s with
// not-running, "stopped while the command ran", when bothyd's keepalive took the frozen
// agent's silence for death (two 15 s keepalive periods, which the pause outlasts).
func TestExecOutlivesAPause(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("doze", true)
	res := make(chan response, 1)
	go func() {
		res <- d.doJSON("POST", "/v1/sandboxes/doze/exec", map[string]any{"command": []string{"sh", "-c", "touch /tmp/started; sleep 1; echo woke"}})
	}()
	waitFor(t, 20*time.Second, "the exec to start", func() bool {
		return d.do("GET", "/v1/sandboxes/doze/files?path=/tmp/started", nil, nil).Status == 200
	})
	decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/doze/pause", nil), 200)
	// The pause must outlast the keepalive's ping and its timeout (15 s each).
	select {
	case r := <-res:
		t.Fatalf("the exec of a paused sandbox answered during the pause: %d %s", r.Status, r.Body)
	case <-time.After(35 * time.Second):
	}
	decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/doze/resume", nil), 200)
	var got execJSON
	select {
	case r := <-res:
		got = decode[execJSON](t, r, 200)
	case <-time.After(30 * time.Second):
		t.Fatal("the exec did not finish after the resume")
	}
	if got.ExitCode != 0 || got.Stdout != "woke\n" {
		t.Fatalf("the exec across the pause: %+v", got)
	}
	if sb := decode[lifecycleJSON](t, d.do("GET", "/v1/sandboxes/doze", nil, nil), 200); sb.State != "running" {
		t.Fatalf("state after the resume: %s", sb.State)
	}

	// A pause that outlasts the command's timeout: the frozen agent cannot end the command,
	// so the server answers sandbox-paused (while the sandbox is still paused), and the
	// command is killed once the sandbox resumes.
	go func() {
		res <- d.doJSON("POST", "/v1/sandboxes/doze/exec", map[string]any{"command": []string{"sh", "-c", "touch /tmp/again; exec sleep 600"}, "timeout_ms": 1000})
	}()
	waitFor(t, 20*time.Second, "the second exec to start", func() bool {
		return d.do("GET", "/v1/sandboxes/doze/files?path=/tmp/again", nil, nil).Status == 200
	})
	decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/doze/pause", nil), 200)
	select {
	case r := <-res:
		wantProblem(t, r, 409, "sandbox-paused")
	case <-time.After(30 * time.Second):
		t.Fatal("the exec of a sandbox paused past the command's timeout did not answer")
	}
	if sb := decode[lifecycleJSON](t, d.do("GET", "/v1/sandboxes/doze", nil, nil), 200); sb.State != "paused" {
		t.Fatalf("state after the overdue exec answered: %s, want still paused", sb.State)
	}
	decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/doze/resume", nil), 200)
	waitFor(t, 20*time.Second, "the overdue command to be killed after the resume", func() bool {
		got := d.exec("doze", map[string]any{"command": []string{"sh", "-c", "pgrep -x sleep || true"}})
		return got.ExitCode == 0 && strings.TrimSpace(got.Stdout) == ""
	})
}

// TestWait: a wait answers as soon as the state is reached, wait-timeout when it is not,
// sandbox-not-found once the sandbox is gone, and 204 for state=deleted.
func TestWait(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("w", false)
	done := make(chan response, 1)
	go func() { done <- d.do("GET", "/v1/sandboxes/w/wait?state=running&timeout_ms=30000", nil, nil) }()
	// The wait subscribes before it reads; a start after it began is seen, however soon.
	if r := d.doJSON("POST", "/v1/sandboxes/w/start", nil); r.Status != 200 {
		t.Fatalf("start: %d %s", r.Status, r.Body)
	}
	if sb := decode[lifecycleJSON](t, <-done, 200); sb.State != "running" {
		t.Fatalf("wait for running answered %s", sb.State)
	}
	// Already in the state: at once.
	decode[lifecycleJSON](t, d.do("GET", "/v1/sandboxes/w/wait?state=running&timeout_ms=1", nil, nil), 200)
	p := wantProblem(t, d.do("GET", "/v1/sandboxes/w/wait?state=stopped&timeout_ms=200", nil, nil), 408, "wait-timeout")
	if p.Detail == "" {
		t.Fatal("wait-timeout without a detail")
	}
	go func() { done <- d.do("GET", "/v1/sandboxes/w/wait?state=deleted&timeout_ms=30000", nil, nil) }()
	if r := d.doJSON("DELETE", "/v1/sandboxes/w?force=true", nil); r.Status != 204 {
		t.Fatalf("forced delete: %d %s", r.Status, r.Body)
	}
	if r := <-done; r.Status != 204 {
		t.Fatalf("wait for deleted: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/w/wait?state=running&timeout_ms=1000", nil, nil), 404, "sandbox-not-found")
	wantProblem(t, d.do("GET", "/v1/sandboxes/w/wait?state=bogus", nil, nil), 400, "invalid-request")
}

// TestLifetime: a sandbox created with timeout_s is stopped when it expires (last_exit
// reason expired); POST /timeout sets it anew; one whose lifetime ends while bothyd is
// SIGKILLed is acted on at the restart.
func TestLifetime(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	sb := decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "brief", "start": true, "timeout_s": 1}), 201)
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/brief?force=true", nil) })
	if sb.ExpiresAt == nil || sb.OnTimeout == nil || *sb.OnTimeout != "stop" {
		t.Fatalf("create with timeout_s: %+v", sb)
	}
	sb = decode[lifecycleJSON](t, d.do("GET", "/v1/sandboxes/brief/wait?state=stopped&timeout_ms=30000", nil, nil), 200)
	if sb.LastExit == nil || sb.LastExit.Reason != "expired" || sb.ExpiresAt != nil {
		t.Fatalf("after the lifetime: %+v", sb)
	}

	// Set anew, then clear: the sandbox keeps running.
	if r := d.doJSON("POST", "/v1/sandboxes/brief/start", nil); r.Status != 200 {
		t.Fatalf("start: %d %s", r.Status, r.Body)
	}
	sb = decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/brief/timeout", map[string]any{"timeout_s": 3600}), 200)
	if sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) < 59*time.Minute {
		t.Fatalf("timeout 3600: expires_at %v", sb.ExpiresAt)
	}
	sb = decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/brief/timeout", map[string]any{"timeout_s": 0}), 200)
	if sb.ExpiresAt != nil || sb.State != "running" {
		t.Fatalf("timeout 0: %+v", sb)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/brief/timeout", map[string]any{"timeout_s": -1}), 400, "invalid-request")

	// Expiry while bothyd is down, with on_timeout delete.
	sb = decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/brief/timeout", map[string]any{"timeout_s": 1, "on_timeout": "delete"}), 200)
	d.Kill()
	waitFor(t, 30*time.Second, "the lifetime to pass while bothyd is down", func() bool {
		return time.Now().After(sb.ExpiresAt.Add(time.Second))
	})
	if procs := runtimeProcesses(t, d.Root); len(procs) != 1 {
		t.Fatalf("runtime processes while bothyd is down: %v, want the sandbox's", procs)
	}
	d.start()
	if r := d.do("GET", "/v1/sandboxes/brief/wait?state=deleted&timeout_ms=30000", nil, nil); r.Status != 204 {
		t.Fatalf("wait for the deletion at start-up: %d %s", r.Status, r.Body)
	}
	if procs := runtimeProcesses(t, d.Root); len(procs) != 0 {
		t.Fatalf("runtime processes after the expiry: %v", procs)
	}
}

// TestExecOutcomes: a command that is not found exits 127 with the reason on stderr, as a
// shell answers it; one that the out-of-memory killer ends says oom_killed.
func TestExecOutcomes(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	sb := decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "outcomes", "start": true, "resources": map[string]any{"memory_mb": 64}}), 201)
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+sb.ID+"?force=true", nil) })
	got := d.exec("outcomes", map[string]any{"command": []string{"no-such-command-xyz"}})
	if got.ExitCode != 127 || !strings.Contains(got.Stderr, "not found") {
		t.Fatalf("a command that is not found: %+v", got)
	}
	// The stream says so the same way: upgraded, the reason on stderr, exit 127.
	for _, tty := range []string{"false", "true"} {
		ws, resp, err := d.dialStream("outcomes", url.Values{"command": {"no-such-command-xyz"}, "tty": {tty}})
		if err != nil {
			var body bytes.Buffer
			if resp != nil {
				body.ReadFrom(resp.Body)
				resp.Body.Close()
			}
			t.Fatalf("the stream of a command that is not found (tty %s) was refused: %v %s", tty, err, body.String())
		}
		exit := ws.wait()
		out := ws.stderr.String()
		if tty == "true" {
			out = ws.stdout.String()
		}
		if exit.ExitCode != 127 || !strings.Contains(out, "not found") {
			t.Fatalf("the stream of a command that is not found (tty %s): exit %+v, stdout %q, stderr %q", tty, exit, ws.stdout.String(), ws.stderr.String())
		}
	}
	var oom struct {
		ExitCode  int  `json:"exit_code"`
		OOMKilled bool `json:"oom_killed"`
	}
	r := d.doJSON("POST", "/v1/sandboxes/outcomes/exec", map[string]any{
		"command": []string{"sh", "-c", "x=$(head -c 400m /dev/zero | tr '\\0' a); echo survived"}, "timeout_ms": 60000})
	if r.Status != 200 || json.Unmarshal(r.Body, &oom) != nil {
		t.Fatalf("the memory hog: %d %s", r.Status, r.Body)
	}
	if !oom.OOMKilled || oom.ExitCode != 137 {
		t.Fatalf("the memory hog was not reported as killed by the OOM killer: %s", r.Body)
	}
}

// TestCaptureOfARunningSandbox: a capture of a running sandbox freezes it for the copy only
// (capture_pause_ms) and leaves it running: a counter started before the capture still counts
// after it, and a clone of the generation sees the files. A paused sandbox's capture leaves
// it paused.
func TestCaptureOfARunningSandbox(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("counting", true)
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/counting?force=true", nil) })
	// setsid: the counter is no part of the exec's process group, which ends with it.
	if got := d.exec("counting", map[string]any{"command": []string{"sh", "-c",
		"echo captured > /home/user/data; setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /home/user/count.tmp; mv /home/user/count.tmp /home/user/count; sleep 0.05; done' </dev/null >/dev/null 2>&1 &"}}); got.ExitCode != 0 {
		t.Fatalf("starting the counter: %+v", got)
	}
	count := func() int {
		got := d.exec("counting", map[string]any{"command": []string{"cat", "/home/user/count"}})
		n := 0
		fmt.Sscan(got.Stdout, &n)
		return n
	}
	waitFor(t, 20*time.Second, "the counter to count", func() bool { return count() > 0 })

	if r := d.doJSON("POST", "/v1/templates", map[string]any{"name": "live"}); r.Status != 201 {
		t.Fatalf("create template: %d %s", r.Status, r.Body)
	}
	var g struct {
		ID             string `json:"id"`
		CapturePauseMS *int64 `json:"capture_pause_ms"`
	}
	g = decode[struct {
		ID             string `json:"id"`
		CapturePauseMS *int64 `json:"capture_pause_ms"`
	}](t, d.doJSON("POST", "/v1/templates/live/generations", map[string]any{"sandbox": "counting"}), 201)
	if g.CapturePauseMS == nil || *g.CapturePauseMS < 1 {
		t.Fatalf("the capture of a running sandbox reports capture_pause_ms %v", g.CapturePauseMS)
	}
	if sb := decode[lifecycleJSON](t, d.do("GET", "/v1/sandboxes/counting", nil, nil), 200); sb.State != "running" {
		t.Fatalf("state after the capture: %s", sb.State)
	}
	after := count()
	waitFor(t, 20*time.Second, "the counter to count on after the capture", func() bool { return count() > after })

	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "counted", "template": "live", "start": true})
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/counted?force=true", nil) })
	got := d.exec("counted", map[string]any{"command": []string{"sh", "-c", "cat /home/user/data; test -s /home/user/count && echo count-is-there"}})
	if got.Stdout != "captured\ncount-is-there\n" {
		t.Fatalf("the clone sees %q", got.Stdout)
	}

	// A paused sandbox is captured as it is, and stays paused.
	decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/counting/pause", nil), 200)
	g = decode[struct {
		ID             string `json:"id"`
		CapturePauseMS *int64 `json:"capture_pause_ms"`
	}](t, d.doJSON("POST", "/v1/templates/live/generations", map[string]any{"sandbox": "counting"}), 201)
	if g.CapturePauseMS != nil {
		t.Fatalf("the capture of a paused sandbox reports capture_pause_ms %d", *g.CapturePauseMS)
	}
	if sb := decode[lifecycleJSON](t, d.do("GET", "/v1/sandboxes/counting", nil, nil), 200); sb.State != "paused" {
		t.Fatalf("state after the capture of a paused sandbox: %s", sb.State)
	}
	decode[lifecycleJSON](t, d.doJSON("POST", "/v1/sandboxes/counting/resume", nil), 200)
	resumed := count()
	waitFor(t, 20*time.Second, "the counter to count on after the resume", func() bool { return count() > resumed })
}

// TestLifecycleRace races pause, resume, timeout (lifetimes that expire during the race
// among them) and forced delete against each other and against start and stop, from several
// clients over a few sandboxes: no answer is a 500, every sandbox the server lists is whole
// (bothyd check finds nothing, each can still be started and run a command), and once all
// are deleted no runtime process is left.
func TestLifecycleRace(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	ids := []string{"race0", "race1", "race2"}
	for _, id := range ids {
		d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id, "start": true})
	}
	t.Cleanup(func() {
		for _, id := range ids {
			d.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil)
		}
	})
	type op struct {
		method, path string
		body         func(r *rand.Rand) any
	}
	ops := []op{
		{"POST", "/pause", nil},
		{"POST", "/resume", nil},
		{"POST", "/start", nil},
		{"POST", "/stop", nil},
		{"POST", "/stop?force=true", nil},
		{"DELETE", "?force=true", nil},
		{"POST", "/timeout", func(r *rand.Rand) any {
			// Mostly lifetimes that outlast the race; some that expire during it.
			switch r.IntN(4) {
			case 0:
				return map[string]any{"timeout_s": 1, "on_timeout": []string{"stop", "delete"}[r.IntN(2)]}
			case 1:
				return map[string]any{"timeout_s": 0}
			}
			return map[string]any{"timeout_s": 3600}
		}},
		{"CREATE", "", nil}, // the id back if a delete took it
	}
	const clients, rounds = 4, 30
	deadline := time.Now().Add(90 * time.Second)
	var mu sync.Mutex
	var failures []string
	done := map[string]int{} // the operations that succeeded, by path
	// The transitions the race is about; the clients go on past their rounds (until the
	// deadline) while one of them has not yet taken effect: whether a resume finds its
	// sandbox paused is the timing's, and a race that raced none proves nothing.
	about := []string{"POST/pause", "POST/resume", "DELETE?force=true", "POST/timeout"}
	raced := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, o := range about {
			if done[o] == 0 {
				return false
			}
		}
		return true
	}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(c), 13))
			for i := 0; (i < rounds || !raced()) && time.Now().Before(deadline); i++ {
				id := ids[r.IntN(len(ids))]
				o := ops[r.IntN(len(ops))]
				var resp response
				switch {
				case o.method == "CREATE":
					resp = d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": r.IntN(2) == 0})
				case o.body != nil:
					resp = d.doJSON(o.method, "/v1/sandboxes/"+id+o.path, o.body(r))
				default:
					resp = d.doJSON(o.method, "/v1/sandboxes/"+id+o.path, nil)
				}
				mu.Lock()
				if resp.Status >= 500 && resp.Status != 503 && resp.Status != 504 {
					failures = append(failures, fmt.Sprintf("%s %s%s: %d %s", o.method, id, o.path, resp.Status, resp.Body))
				}
				if resp.Status < 300 {
					done[o.method+o.path]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("server errors in the race:\n%s", strings.Join(failures, "\n"))
	}
	// The race raced: the transitions it is about took effect, not only refusals.
	for _, o := range about {
		if done[o] == 0 {
			t.Fatalf("no %s succeeded in the race (%v): it raced nothing", o, done)
		}
	}

	// Whole: what the server lists is what the state root holds, and each works. A lifetime
	// set during the race is cleared first, so that none ends a sandbox under the checks.
	for _, id := range ids {
		if r := d.doJSON("POST", "/v1/sandboxes/"+id+"/timeout", map[string]any{"timeout_s": 0}); r.Status != 200 && r.Status != 404 {
			t.Fatalf("clearing %s's lifetime: %d %s", id, r.Status, r.Body)
		}
	}
	mustCheckClean(t, d.Root, "after the race")
	for _, id := range ids {
		r := d.do("GET", "/v1/sandboxes/"+id, nil, nil)
		if r.Status == 404 {
			if _, err := os.Lstat(filepath.Join(d.Root, "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s is gone for the API but its state directory is there: %v", id, err)
			}
			d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id})
		}
		sb := decode[lifecycleJSON](t, d.do("GET", "/v1/sandboxes/"+id, nil, nil), 200)
		switch sb.State {
		case "paused":
			d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/resume", nil)
		case "provisioned", "stopped":
			d.mustStatus(200, "POST", "/v1/sandboxes/"+id+"/start", nil)
		case "running":
		default:
			t.Fatalf("%s is %s after the race", id, sb.State)
		}
		if got := d.exec(id, map[string]any{"command": []string{"true"}}); got.ExitCode != 0 {
			t.Fatalf("exec in %s after the race: %+v", id, got)
		}
	}
	for _, id := range ids {
		if r := d.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil); r.Status != 204 {
			t.Fatalf("forced delete of %s: %d %s", id, r.Status, r.Body)
		}
	}
	if procs := runtimeProcesses(t, d.Root); len(procs) != 0 {
		t.Fatalf("runtime processes after the race's sandboxes were deleted: %v", procs)
	}
	mustCheckClean(t, d.Root, "after the race's sandboxes were deleted")
}
