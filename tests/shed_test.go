package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// TestShimShedsItsSetUp: a sandbox that keeps running has its shim replace itself by a
// process that only waits (runtime/namespace/shim, shed). The runtime process stays the one
// bothyd recorded (pid and start time); the sandbox serves on, survives a SIGKILLed
// bothyd, passes `bothyd check`, and still ends as a sandbox should: a TERM to the shim
// shuts it down gracefully with its outcome recorded, and a stop stops it.
func TestShimShedsItsSetUp(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	ids := []string{"term", "stop"}
	before := map[string]runtime.Process{}
	for _, id := range ids {
		d.create(id, true)
		before[id] = shimProcess(t, d, id)
	}
	for _, id := range ids {
		log := filepath.Join(d.Root, "sandboxes", id, "sandbox.log")
		waitFor(t, 30*time.Second, "the shim of "+id+" to shed its set-up", func() bool {
			b, _ := os.ReadFile(log)
			return bytes.Contains(b, []byte("shed its set-up"))
		})
		if got := shimProcess(t, d, id); got.ID != before[id].ID || !got.ID.Alive() {
			t.Fatalf("the shim of %s is %+v after it shed its set-up, not the process recorded, %+v", id, got.ID, before[id].ID)
		}
		if got := d.exec(id, map[string]any{"command": []string{"sh", "-c", "echo served"}}); got.Stdout != "served\n" {
			t.Fatalf("exec in %s after its shim shed: %+v", id, got)
		}
	}

	d.Restart(true)
	for _, id := range ids {
		if got := d.exec(id, map[string]any{"command": []string{"true"}}); got.ExitCode != 0 {
			t.Fatalf("exec in %s after bothyd was killed and restarted: %+v", id, got)
		}
	}
	if report, code, stderr := runCheck(t, d.Root); code != 0 {
		t.Fatalf("bothyd check beside shims that shed: exit %d, %+v %s", code, report, stderr)
	}

	// A TERM for the shim is still the sandbox's request to shut down.
	if err := platform.SignalVerified(before["term"].ID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the sandbox to stop on its shim's TERM", func() bool {
		var sb sandboxJSON
		return json.Unmarshal(d.do("GET", "/v1/sandboxes/term", nil, nil).Body, &sb) == nil && sb.State == "stopped"
	})
	sb := decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/term", nil, nil), 200)
	if sb.LastExit == nil || sb.LastExit.Reason != "exited" || sb.LastExit.Code == nil || *sb.LastExit.Code != 0 {
		t.Fatalf("last_exit after a TERM to the shim that shed: %+v; want a clean exit", sb.LastExit)
	}
	log, _ := os.ReadFile(filepath.Join(d.Root, "sandboxes", "term", "sandbox.log"))
	if !strings.Contains(string(log), "forwarding terminated to the sandbox") {
		t.Fatalf("the waiting shim did not pass the TERM on; its log:\n%s", log)
	}

	if r := d.doJSON("POST", "/v1/sandboxes/stop/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	sb = decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/stop", nil, nil), 200)
	if sb.State != "stopped" || sb.LastExit == nil || sb.LastExit.Reason != "stopped" {
		t.Fatalf("after a stop: %s, %+v", sb.State, sb.LastExit)
	}
	if left := runtimeProcesses(t, d.Root); len(left) != 0 {
		t.Fatalf("runtime processes left after both sandboxes ended: %v", left)
	}
}

// shimProcess returns the one live shim of sandbox id.
func shimProcess(t *testing.T, d *daemon, id string) runtime.Process {
	t.Helper()
	var found []runtime.Process
	for _, p := range listProcesses(t, d.Root) {
		if p.Role == runtime.RoleShim && filepath.Base(p.Dir) == id {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d shims of %s: %+v", len(found), id, found)
	}
	return found[0]
}
