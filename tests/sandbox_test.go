package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/openapi/client"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// requireRoot skips a test that starts sandboxes when it cannot: the namespace runtime needs
// root. CI runs as root.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("starting sandboxes needs root (the namespace runtime); CI runs as root")
	}
}

// api is the generated client for a daemon, its answers checked against the contract.
func (d *daemon) api() *client.ClientWithResponses {
	d.t.Helper()
	c, err := client.NewClientWithResponses(d.URL, client.WithHTTPClient(d.checkedClient(nil)), client.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		if d.Token != "" {
			req.Header.Set("Authorization", "Bearer "+d.Token)
		}
		return nil
	}))
	if err != nil {
		d.t.Fatal(err)
	}
	return c
}

// sandboxJSON is the part of a Sandbox the tests look at.
type sandboxJSON struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	LastExit *struct {
		Code   *int   `json:"code"`
		Reason string `json:"reason"`
	} `json:"last_exit"`
}

type execJSON struct {
	ExitCode        int     `json:"exit_code"`
	Signal          *string `json:"signal"`
	TimedOut        bool    `json:"timed_out"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutTruncated bool    `json:"stdout_truncated"`
}

func decode[T any](t testing.TB, r response, status int) T {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("decoding %s: %v", r.Body, err)
	}
	return v
}

// create makes a sandbox and, with start, starts it; it is deleted (stopped first) when the
// test ends.
func (d *daemon) create(id string, start bool) sandboxJSON {
	d.t.Helper()
	sb := decode[sandboxJSON](d.t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": start}), 201)
	d.t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
	})
	return sb
}

func (d *daemon) exec(id string, body map[string]any) execJSON {
	d.t.Helper()
	return decode[execJSON](d.t, d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", body), 200)
}

// cgroupName is the cgroup of a sandbox of this daemon (below the default parent).
func (d *daemon) cgroupName(id string) string {
	return "bothy/" + shim.CgroupLeaf(id, filepath.Join(d.Root, "sandboxes", id))
}

// listProcesses lists the live runtime processes (shims and inits) of a state root.
func listProcesses(t testing.TB, root string) []runtime.Process {
	t.Helper()
	rt, err := namespace.New(namespace.Config{})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := rt.Processes(root)
	if err != nil {
		t.Fatal(err)
	}
	return procs
}

// killInit kills a sandbox's init from the host with SIGKILL, as a crash or the OOM killer
// would; the test fails unless there was exactly one.
func (d *daemon) killInit(id string) {
	d.t.Helper()
	procs := listProcesses(d.t, d.Root)
	killed := 0
	for _, p := range procs {
		if p.Role == "init" && filepath.Base(p.Dir) == id {
			if err := platform.SignalVerified(p.ID, syscall.SIGKILL); err != nil {
				d.t.Fatal(err)
			}
			killed++
		}
	}
	if killed != 1 {
		d.t.Fatalf("found %d inits of sandbox %s in %v", killed, id, procs)
	}
}

// runtimeProcesses counts the live runtime processes (shims) of a state root.
func runtimeProcesses(t testing.TB, root string) map[string]int {
	t.Helper()
	byDir := map[string]int{}
	for _, p := range listProcesses(t, root) {
		if p.Role == "shim" {
			byDir[p.Dir]++
		}
	}
	return byDir
}

// TestWalkthrough is the README's walkthrough, through the generated client.
func TestWalkthrough(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	api := d.api()
	ctx := context.Background()

	id := "walk"
	start := true
	labels := client.Labels{"team": "grading"}
	created, err := api.CreateSandboxWithResponse(ctx, nil, client.CreateSandboxJSONRequestBody{ID: &id, Start: &start, Labels: &labels})
	if err != nil || created.JSON201 == nil {
		t.Fatalf("create: %v %s", err, created.Body)
	}
	if created.JSON201.State != client.SandboxStateRunning {
		t.Fatalf("created with start=true but state %q", created.JSON201.State)
	}
	t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
	})

	sel := []string{"team=grading"}
	list, err := api.ListSandboxesWithResponse(ctx, &client.ListSandboxesParams{Label: &sel})
	if err != nil || list.JSON200 == nil || len(list.JSON200.Items) != 1 || list.JSON200.Items[0].ID != id {
		t.Fatalf("list by label: %v %s", err, list.Body)
	}
	other := []string{"team=other"}
	if list, _ := api.ListSandboxesWithResponse(ctx, &client.ListSandboxesParams{Label: &other}); list.JSON200 == nil || len(list.JSON200.Items) != 0 {
		t.Fatalf("list by another label found something: %s", list.Body)
	}

	stdin := "from stdin"
	ex, err := api.ExecCommandWithResponse(ctx, id, client.ExecCommandJSONRequestBody{
		Command: []string{"sh", "-c", "cat; echo; echo to-stderr >&2; hostname; id -u; exit 3"},
		Stdin:   &stdin,
	})
	if err != nil || ex.JSON200 == nil {
		t.Fatalf("exec: %v %s", err, ex.Body)
	}
	if got := ex.JSON200; got.ExitCode != 3 || got.Stdout != "from stdin\nwalk\n1000\n" || got.Stderr != "to-stderr\n" {
		t.Fatalf("exec result %+v", got)
	}

	path := "/home/user/notes/hello.txt"
	w, err := api.WriteFileWithBodyWithResponse(ctx, id, &client.WriteFileParams{Path: path}, "application/octet-stream", strings.NewReader("hello, sandbox"))
	if err != nil || w.StatusCode() != 204 {
		t.Fatalf("write file: %v %d %s", err, w.StatusCode(), w.Body)
	}
	r, err := api.ReadFileWithResponse(ctx, id, &client.ReadFileParams{Path: path})
	if err != nil || r.StatusCode() != 200 || string(r.Body) != "hello, sandbox" {
		t.Fatalf("read file: %v %d %q", err, r.StatusCode(), r.Body)
	}
	ls, err := api.ListFilesWithResponse(ctx, id, &client.ListFilesParams{Path: "/home/user/notes"})
	if err != nil || ls.JSON200 == nil || len(ls.JSON200.Items) != 1 || ls.JSON200.Items[0].Name != "hello.txt" {
		t.Fatalf("list directory: %v %s", err, ls.Body)
	}
	if got := d.exec(id, map[string]any{"command": []string{"cat", path}}); got.Stdout != "hello, sandbox" {
		t.Fatalf("the file written through the API reads %q inside the sandbox", got.Stdout)
	}
	rm, err := api.RemoveFileWithResponse(ctx, id, &client.RemoveFileParams{Path: path})
	if err != nil || rm.StatusCode() != 204 {
		t.Fatalf("remove file: %v %s", err, rm.Body)
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/"+id+"/files?path="+path, nil, nil), 404, "file-not-found")

	stopped, err := api.StopSandboxWithResponse(ctx, id, nil)
	if err != nil || stopped.JSON200 == nil || stopped.JSON200.State != client.SandboxStateStopped {
		t.Fatalf("stop: %v %s", err, stopped.Body)
	}
	if le := stopped.JSON200.LastExit; le == nil || le.Reason != client.LastExitReasonStopped {
		t.Fatalf("after a stop, last_exit = %+v", le)
	}
	logs, err := api.GetSandboxLogsWithResponse(ctx, id, nil)
	if err != nil || logs.StatusCode() != 200 {
		t.Fatalf("logs: %v %s", err, logs.Body)
	}
	restarted, err := api.StartSandboxWithResponse(ctx, id, nil)
	if err != nil || restarted.JSON200 == nil || restarted.JSON200.State != client.SandboxStateRunning {
		t.Fatalf("start again: %v %s", err, restarted.Body)
	}
	if got := d.exec(id, map[string]any{"command": []string{"true"}}); got.ExitCode != 0 {
		t.Fatalf("exec after restart: %+v", got)
	}
	if _, err := api.StopSandboxWithResponse(ctx, id, nil); err != nil {
		t.Fatal(err)
	}
	del, err := api.DeleteSandboxWithResponse(ctx, id, nil)
	if err != nil || del.StatusCode() != 204 {
		t.Fatalf("delete: %v %s", err, del.Body)
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/"+id, nil, nil), 404, "sandbox-not-found")
	if n := runtimeProcesses(t, d.Root); len(n) != 0 {
		t.Fatalf("runtime processes left after delete: %v", n)
	}
}

// TestErrorCodes produces each reachable code of the error table over HTTP.
func TestErrorCodes(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("run", true)
	d.create("idle", false)

	t.Run("not found", func(t *testing.T) {
		d := d.in(t)
		for _, c := range []struct{ method, path string }{
			{"GET", "/v1/sandboxes/nope"},
			{"POST", "/v1/sandboxes/nope/start"},
			{"POST", "/v1/sandboxes/nope/stop"},
			{"DELETE", "/v1/sandboxes/nope"},
			{"GET", "/v1/sandboxes/nope/logs"},
		} {
			wantProblem(t, d.doJSON(c.method, c.path, nil), 404, "sandbox-not-found")
		}
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes/nope/exec", map[string]any{"command": []string{"true"}}), 404, "sandbox-not-found")
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"image": "no-such-image"}), 404, "image-not-found")
		wantProblem(t, d.do("GET", "/v1/sandboxes/run/files?path=/no/such/file", nil, nil), 404, "file-not-found")
	})
	t.Run("conflicts", func(t *testing.T) {
		d := d.in(t)
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "run"}), 409, "already-provisioned")
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes/run/start", nil), 409, "already-running")
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes/idle/stop", nil), 409, "not-running")
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes/idle/exec", map[string]any{"command": []string{"true"}}), 409, "not-running")
		wantProblem(t, d.do("GET", "/v1/sandboxes/idle/files?path=/tmp", nil, nil), 409, "not-running")
		wantProblem(t, d.doJSON("DELETE", "/v1/sandboxes/run", nil), 409, "sandbox-launched")
	})
	t.Run("bad input", func(t *testing.T) {
		d := d.in(t)
		p := wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"labels": map[string]string{"Bad Key": "x"}}), 400, "invalid-request")
		if p.Field != "labels" {
			t.Fatalf("field %q, want labels", p.Field)
		}
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes/run/exec", map[string]any{"command": []string{}}), 400, "invalid-request")
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes/run/exec", map[string]any{"command": []string{"true"}, "cwd": "relative"}), 400, "invalid-request")
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes/run/exec", map[string]any{"command": []string{"true"}, "wait_ms": 0}), 400, "invalid-request")
		wantProblem(t, d.do("GET", "/v1/sandboxes/run/files?path=etc/passwd", nil, nil), 400, "invalid-request")
	})
}

// TestExecAdmission: one exec at a time; a second one with a short wait_ms is refused with
// sandbox-busy, and admitted once the first ends.
func TestExecAdmission(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("busy", true)

	// The first exec signals through a file when it has started, then waits to be released.
	first := make(chan execJSON, 1)
	go func() {
		first <- d.exec("busy", map[string]any{"command": []string{"sh", "-c", "touch /tmp/started; while [ ! -e /tmp/release ]; do sleep 0.01; done; echo done"}})
	}()
	waitFor(t, 20*time.Second, "the first exec to start", func() bool {
		r := d.do("GET", "/v1/sandboxes/busy/files?path=/tmp/started", nil, nil)
		return r.Status == 200
	})
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/busy/exec", map[string]any{"command": []string{"true"}, "wait_ms": 100}), 423, "sandbox-busy")

	// A second exec that waits long enough is admitted once the first ends.
	second := make(chan response, 1)
	go func() {
		second <- d.doJSON("POST", "/v1/sandboxes/busy/exec", map[string]any{"command": []string{"echo", "second"}, "wait_ms": 30000})
	}()
	if r := d.do("PUT", "/v1/sandboxes/busy/files?path=/tmp/release", strings.NewReader(""), http.Header{"Content-Type": {"application/octet-stream"}}); r.Status != 204 {
		t.Fatalf("releasing the first exec: %d %s", r.Status, r.Body)
	}
	if got := <-first; got.Stdout != "done\n" {
		t.Fatalf("first exec: %+v", got)
	}
	if got := decode[execJSON](t, <-second, 200); got.Stdout != "second\n" {
		t.Fatalf("second exec: %+v", got)
	}
}

// TestTransitionInProgress: a transition that waits out its deadline behind another answers
// 423 transition-in-progress.
func TestTransitionInProgress(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("slow", true)
	// A workload that ignores TERM makes the graceful stop hold the lock through the grace.
	go d.exec("slow", map[string]any{"command": []string{"sh", "-c", "trap '' TERM; touch /tmp/trapped; sleep 30"}, "timeout_ms": 60000})
	waitFor(t, 20*time.Second, "the TERM-proof workload", func() bool {
		return d.do("GET", "/v1/sandboxes/slow/files?path=/tmp/trapped", nil, nil).Status == 200
	})
	stopDone := make(chan response, 1)
	go func() { stopDone <- d.doJSON("POST", "/v1/sandboxes/slow/stop?timeout=6000", nil) }()
	waitFor(t, 10*time.Second, "the stop to hold the lock", func() bool {
		var sb sandboxJSON
		return json.Unmarshal(d.do("GET", "/v1/sandboxes/slow", nil, nil).Body, &sb) == nil && sb.State == "stopping"
	})
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/slow/start?timeout=100", nil), 423, "transition-in-progress")
	if r := <-stopDone; r.Status != 200 {
		t.Fatalf("the slow stop: %d %s", r.Status, r.Body)
	}
}

// TestOverlappingStarts: two overlapping starts of one sandbox launch exactly one sandbox.
func TestOverlappingStarts(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	for round := range 5 {
		id := fmt.Sprintf("race%d", round)
		d.create(id, false)
		var wg sync.WaitGroup
		results := make([]response, 2)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = d.doJSON("POST", "/v1/sandboxes/"+id+"/start", nil)
			}()
		}
		wg.Wait()
		ok := 0
		for _, r := range results {
			switch r.Status {
			case 200:
				ok++
			case 409:
				wantProblem(t, r, 409, "already-running")
			case 423:
				wantProblem(t, r, 423, "transition-in-progress")
			default:
				t.Fatalf("start answered %d: %s", r.Status, r.Body)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d starts succeeded, want exactly 1", round, ok)
		}
		procs := runtimeProcesses(t, d.Root)
		for dir, n := range procs {
			if n != 1 {
				t.Fatalf("round %d: %d runtime processes for %s", round, n, dir)
			}
		}
		if r := d.doJSON("POST", "/v1/sandboxes/"+id+"/stop", nil); r.Status != 200 {
			t.Fatalf("stop: %d %s", r.Status, r.Body)
		}
		if r := d.doJSON("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete: %d %s", r.Status, r.Body)
		}
	}
}

// TestRestartKeepsSandboxes: sandboxes keep running across a restart of bothyd, gracefully
// or by SIGKILL, and answer exec afterwards; no duplicate or orphaned sandbox process.
func TestRestartKeepsSandboxes(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("kill=%v", kill), func(t *testing.T) {
			d := startDaemon(t)
			ids := []string{"keep1", "keep2"}
			for _, id := range ids {
				d.create(id, true)
				d.exec(id, map[string]any{"command": []string{"sh", "-c", "echo before > /home/user/mark"}})
			}
			before := runtimeProcesses(t, d.Root)
			d.Restart(kill)
			for _, id := range ids {
				sb := decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/"+id, nil, nil), 200)
				if sb.State != "running" {
					t.Fatalf("%s is %s after the restart", id, sb.State)
				}
				if got := d.exec(id, map[string]any{"command": []string{"cat", "/home/user/mark"}}); got.Stdout != "before\n" {
					t.Fatalf("%s after restart: %+v", id, got)
				}
			}
			after := runtimeProcesses(t, d.Root)
			if fmt.Sprint(before) != fmt.Sprint(after) || len(after) != len(ids) {
				t.Fatalf("runtime processes before %v, after %v", before, after)
			}
		})
	}
}

// TestSandboxExitIsSeen: a sandbox whose init is killed from the host (as a crash or the OOM
// killer would) reads as stopped, with how it ended, and can be started again.
func TestSandboxExitIsSeen(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("exits", true)
	d.killInit("exits")
	waitFor(t, 20*time.Second, "the sandbox to read as stopped", func() bool {
		var sb sandboxJSON
		return json.Unmarshal(d.do("GET", "/v1/sandboxes/exits", nil, nil).Body, &sb) == nil && sb.State == "stopped"
	})
	sb := decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/exits", nil, nil), 200)
	if sb.LastExit == nil || sb.LastExit.Reason != "killed" {
		t.Fatalf("last_exit after the init was killed: %+v", sb.LastExit)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/exits/exec", map[string]any{"command": []string{"true"}}), 409, "not-running")
	if r := d.doJSON("POST", "/v1/sandboxes/exits/start", nil); r.Status != 200 {
		t.Fatalf("start after exit: %d %s", r.Status, r.Body)
	}
	if got := d.exec("exits", map[string]any{"command": []string{"true"}}); got.ExitCode != 0 {
		t.Fatalf("exec after the new start: %+v", got)
	}
}

// TestSingleBinary: bothyd alone, told to (--runtime-binary self; without the flag it would
// build bothyd-runtime from its source tree, see TestDefaultRuntimeIsSlim), runs sandboxes by
// re-executing itself; one binary is enough.
func TestSingleBinary(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	dir := t.TempDir()
	alone := filepath.Join(dir, "bothyd")
	b, err := os.ReadFile(bothydBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(alone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, withBinary(alone), withArgs("--runtime-binary", "self"))
	if !strings.Contains(d.logs.String(), `"executable":""`) {
		t.Fatalf("bothyd alone did not choose to re-execute itself:\n%s", d.logs.String())
	}
	d.create("alone", true)
	if got := d.exec("alone", map[string]any{"command": []string{"echo", "one binary"}}); got.Stdout != "one binary\n" {
		t.Fatalf("exec: %+v", got)
	}
	if r := d.doJSON("POST", "/v1/sandboxes/alone/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
}

// TestRuntimeBinaryIsUsed: with bothyd-runtime beside bothyd (the test binaries' layout),
// sandboxes run the small binary.
func TestRuntimeBinaryIsUsed(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("small", true)
	for dir := range runtimeProcesses(t, d.Root) {
		if filepath.Base(dir) != "small" {
			continue
		}
		procs, _ := os.ReadDir("/proc")
		found := false
		for _, p := range procs {
			cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
			if err != nil || !strings.Contains(string(cmdline), "__shim\x00"+dir) {
				continue
			}
			exe, _ := os.Readlink(filepath.Join("/proc", p.Name(), "exe"))
			if filepath.Base(exe) != "bothyd-runtime" {
				t.Fatalf("the shim runs %s, not bothyd-runtime", exe)
			}
			found = true
		}
		if !found {
			t.Fatal("no shim of the sandbox found in /proc")
		}
		return
	}
	t.Fatal("the sandbox has no runtime process")
}
