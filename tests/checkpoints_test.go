package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The end-to-end tests of checkpoints, rollback and fork (docs/checkpoints.md) against the
// real bothyd. Sandboxes here have no disk of their own (disk_mb 0): checkpoints need their
// writable layer in the state directory.

type checkpointJSON struct {
	Name      string `json:"name"`
	SizeBytes int64  `json:"size_bytes"`
	Mode      string `json:"mode"`
	FreezeMS  int64  `json:"freeze_ms"`
	Layers    int    `json:"layers"`
}

type forkJSON struct {
	FreezeMS int64 `json:"freeze_ms"`
	Items    []struct {
		ID      string       `json:"id"`
		Sandbox *sandboxJSON `json:"sandbox"`
		Error   *problem     `json:"error"`
	} `json:"items"`
}

// createNoDisk creates and starts a sandbox without a disk of its own.
func (d *daemon) createNoDisk(id string) {
	d.t.Helper()
	decode[sandboxJSON](d.t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true, "resources": map[string]any{"disk_mb": 0}}), 201)
	d.t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
	})
}

// rootSh runs a shell script as root in the sandbox and returns its stdout; it must exit 0.
func (d *daemon) rootSh(id, script string) string {
	d.t.Helper()
	r := d.exec(id, map[string]any{"command": []string{"sh", "-c", script}, "user": "root"})
	if r.ExitCode != 0 {
		d.t.Fatalf("%s: %q exited %d: %s", id, script, r.ExitCode, r.Stderr)
	}
	return r.Stdout
}

// TestForkMidProcess forks a sandbox while a process in it writes a counter: what was
// written before the fork is in every fork, a write after the fork in one fork is in no other
// and not in the source, and the source's later write is in no fork; the source runs on.
func TestForkMidProcess(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.createNoDisk("fsrc")
	d.rootSh("fsrc", "echo before > /home/user/f; (i=0; while :; do i=$((i+1)); echo $i > /home/user/.c; mv /home/user/.c /home/user/counter; done) >/dev/null 2>&1 &")
	waitFor(t, 10*time.Second, "the counter to count", func() bool {
		return d.rootSh("fsrc", "cat /home/user/counter 2>/dev/null || echo 0") != "0\n"
	})
	res := decode[forkJSON](t, d.doJSON("POST", "/v1/sandboxes/fsrc/fork", map[string]any{"ids": []string{"fa", "fb", "fc"}}), 200)
	for _, id := range []string{"fa", "fb", "fc"} {
		t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil) })
	}
	if len(res.Items) != 3 {
		t.Fatalf("fork answered %d items, want 3: %+v", len(res.Items), res)
	}
	for _, it := range res.Items {
		if it.Error != nil || it.Sandbox == nil || it.Sandbox.State != "running" {
			t.Fatalf("fork %s: %+v %+v", it.ID, it.Sandbox, it.Error)
		}
	}
	if res.FreezeMS < 0 {
		t.Fatalf("freeze_ms %d", res.FreezeMS)
	}
	if st := decode[sandboxJSON](t, d.doJSON("GET", "/v1/sandboxes/fsrc", nil), 200); st.State != "running" {
		t.Fatalf("the source is %s after the fork", st.State)
	}
	// The source's process runs on after the freeze.
	c1 := d.rootSh("fsrc", "cat /home/user/counter")
	waitFor(t, 10*time.Second, "the source's counter to go on", func() bool { return d.rootSh("fsrc", "cat /home/user/counter") != c1 })

	d.rootSh("fa", "echo a > /home/user/mine")
	d.rootSh("fsrc", "echo after > /home/user/f")
	for _, id := range []string{"fa", "fb", "fc"} {
		if got := d.rootSh(id, "cat /home/user/f; test -s /home/user/counter && echo counted"); got != "before\ncounted\n" {
			t.Fatalf("%s reads %q, want the files of the fork's point", id, got)
		}
	}
	for _, id := range []string{"fb", "fc", "fsrc"} {
		if got := d.rootSh(id, "cat /home/user/mine 2>/dev/null || echo none"); got != "none\n" {
			t.Fatalf("%s sees fa's write: %q", id, got)
		}
	}
	// The forks keep their files when the source goes.
	if r := d.doJSON("DELETE", "/v1/sandboxes/fsrc?force=true", nil); r.Status != 204 {
		t.Fatalf("delete of the source: %d %s", r.Status, r.Body)
	}
	if got := d.rootSh("fb", "cat /home/user/f"); got != "before\n" {
		t.Fatalf("fb after the source's delete reads %q", got)
	}
	mustCheckClean(t, d.Root, "after forks")
}

// TestRollbackAfterRmHome: a checkpoint, rm -rf of the user's home, a rollback: the home is
// back, the sandbox keeps its id and runs; the checkpoint is listed with its size, and
// deleted.
func TestRollbackAfterRmHome(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.createNoDisk("rb")
	d.rootSh("rb", "mkdir -p /home/user/project && echo precious > /home/user/project/data && chown -R user /home/user/project")
	c := decode[checkpointJSON](t, d.doJSON("POST", "/v1/sandboxes/rb/checkpoints", map[string]any{"name": "good"}), 201)
	if c.Name != "good" || c.Mode != "copy" || c.SizeBytes == 0 || c.Layers != 1 {
		t.Fatalf("checkpoint %+v", c)
	}
	d.rootSh("rb", "rm -rf /home/user && echo junk > /tmp/junk")
	if got := d.rootSh("rb", "ls /home/user 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Fatalf("the home survived rm -rf: %q", got)
	}
	st := decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/rb/checkpoints/good/rollback", nil), 200)
	if st.ID != "rb" || st.State != "running" {
		t.Fatalf("after the rollback: %+v", st)
	}
	if got := d.rootSh("rb", "cat /home/user/project/data; stat -c %U /home/user/project/data; ls /tmp/junk 2>/dev/null || echo gone"); got != "precious\nuser\ngone\n" {
		t.Fatalf("after the rollback the files read %q", got)
	}
	list := decode[struct{ Items []checkpointJSON }](t, d.doJSON("GET", "/v1/sandboxes/rb/checkpoints", nil), 200)
	if len(list.Items) != 1 || list.Items[0].Name != "good" || list.Items[0].SizeBytes != c.SizeBytes {
		t.Fatalf("list %+v", list)
	}
	decode[checkpointJSON](t, d.doJSON("GET", "/v1/sandboxes/rb/checkpoints/good", nil), 200)
	if r := d.doJSON("DELETE", "/v1/sandboxes/rb/checkpoints/good", nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.doJSON("GET", "/v1/sandboxes/rb/checkpoints/good", nil), 404, "checkpoint-not-found")
	// The sandbox still stands on the deleted checkpoint's layer? No: a copy's layer was
	// never the sandbox's own; the rollback made it so, and deleting the checkpoint keeps it.
	if got := d.rootSh("rb", "cat /home/user/project/data"); got != "precious\n" {
		t.Fatalf("after the delete: %q", got)
	}
	mustCheckClean(t, d.Root, "after rollback")
}

// TestCheckpointBounds: every refusal has its code.
func TestCheckpointBounds(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--checkpoint-max", "2"))
	d.createNoDisk("bd")
	for _, n := range []string{"one", "two"} {
		decode[checkpointJSON](t, d.doJSON("POST", "/v1/sandboxes/bd/checkpoints", map[string]any{"name": n}), 201)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/bd/checkpoints", map[string]any{"name": "three"}), 409, "checkpoint-limit")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/bd/checkpoints", map[string]any{"name": "one"}), 409, "checkpoint-exists")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/bd/checkpoints", map[string]any{"name": "Bad/Name"}), 400, "invalid-request")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/bd/checkpoints/nope/rollback", nil), 404, "checkpoint-not-found")
	wantProblem(t, d.doJSON("DELETE", "/v1/sandboxes/bd/checkpoints/nope", nil), 404, "checkpoint-not-found")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/nobody/checkpoints", map[string]any{"name": "x"}), 404, "sandbox-not-found")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/bd/fork", map[string]any{"count": 17}), 400, "invalid-request")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/bd/fork", map[string]any{"count": 2, "ids": []string{"x1"}}), 400, "invalid-request")
	// A sandbox with a disk of its own (the server's default) is copied: one that never ran
	// has an empty checkpoint.
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "withdisk", "resources": map[string]any{"disk_mb": 64}}), 201)
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/withdisk", nil) })
	if c := decode[checkpointJSON](t, d.doJSON("POST", "/v1/sandboxes/withdisk/checkpoints", map[string]any{"name": "x"}), 201); c.Mode != "copy" || c.SizeBytes != 0 {
		t.Fatalf("checkpoint of a disk sandbox that never ran: %+v", c)
	}
	// A fork onto a taken id fails alone; the other is made.
	res := decode[forkJSON](t, d.doJSON("POST", "/v1/sandboxes/bd/fork", map[string]any{"ids": []string{"withdisk", "bdfork"}}), 200)
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/bdfork?force=true", nil) })
	if len(res.Items) != 2 || res.Items[0].Error == nil || res.Items[0].Error.Code != "already-provisioned" || res.Items[1].Sandbox == nil {
		t.Fatalf("a fork onto a taken id and a free one: %+v", res)
	}
}

var (
	crashBuild    sync.Once
	crashBinary   string
	crashBuildErr error
)

// crashBothyd builds bothyd with the crashpoints tag once: BOTHYD_CRASH_AT=<step> makes it
// kill itself with SIGKILL at that step of the supervisor (cmd/bothyd/crashpoint_on.go).
func crashBothyd(t *testing.T) string {
	t.Helper()
	if os.Getenv("BOTHY_TEST_BIN_DIR") != "" {
		t.Skip("the crash-point build needs Go; prebuilt binaries have no crash points")
	}
	crashBuild.Do(func() {
		// Inside the harness's directory, which TestMain removes: each run left its 30-70 MB
		// build in the temp directory before.
		dir := filepath.Join(filepath.Dir(bothydBin), "crashpoints")
		if err := os.Mkdir(dir, 0o755); err != nil {
			crashBuildErr = err
			return
		}
		out, err := exec.Command("go", "build", "-tags", "crashpoints", "-o", dir, "github.com/bothy/bothy/cmd/bothyd").CombinedOutput()
		if err != nil {
			crashBuildErr = fmt.Errorf("%v: %s", err, out)
			return
		}
		// The runtime the harness built goes beside it, as beside bothydBin: without it each
		// parallel server would build its own from the source tree on its first start.
		runtime, err := os.ReadFile(filepath.Join(filepath.Dir(bothydBin), "bothyd-runtime"))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "bothyd-runtime"), runtime, 0o755)
		}
		if err != nil {
			crashBuildErr = err
			return
		}
		crashBinary = filepath.Join(dir, "bothyd")
	})
	if crashBuildErr != nil {
		t.Fatal(crashBuildErr)
	}
	return crashBinary
}

// TestCheckpointCrashPoints kills the real bothyd (SIGKILL) at each step of a checkpoint, a
// rollback, a delete and a fork; the restarted server finishes or undoes the operation: the
// sandbox's files are at one point or the other, an interrupted fork is gone, and `bothyd
// check` finds nothing.
func TestCheckpointCrashPoints(t *testing.T) {
	requireRoot(t)
	bin := crashBothyd(t)
	type step struct{ op, at string }
	var steps []step
	for _, at := range []string{"checkpoint-frozen", "checkpoint-recorded", "checkpoint-copied", "checkpoint-committed"} {
		steps = append(steps, step{"checkpoint", at})
	}
	for _, at := range []string{"rollback-stopped", "rollback-recorded", "rollback-discarded", "rollback-swapped", "rollback-committed"} {
		steps = append(steps, step{"rollback", at})
	}
	steps = append(steps, step{"delete", "checkpoint-deleted"})
	for _, at := range []string{"fork-frozen", "fork-point", "fork-linked", "journaled", "spawned"} {
		steps = append(steps, step{"fork", at})
	}
	for _, s := range steps {
		t.Run(s.op+"/"+s.at, func(t *testing.T) {
			t.Parallel()
			d := startDaemon(t, withBinary(bin))
			d.createNoDisk("cp")
			d.rootSh("cp", "echo base > /home/user/f")
			decode[checkpointJSON](t, d.doJSON("POST", "/v1/sandboxes/cp/checkpoints", map[string]any{"name": "base"}), 201)
			d.rootSh("cp", "echo later > /home/user/f")

			// The crashing server: the request is cut off by its death.
			d.Stop()
			d.env = []string{"BOTHYD_CRASH_AT=" + s.at}
			d.start()
			var method, path string
			var body any
			switch s.op {
			case "checkpoint":
				method, path, body = "POST", "/v1/sandboxes/cp/checkpoints", map[string]any{"name": "new"}
			case "rollback":
				method, path = "POST", "/v1/sandboxes/cp/checkpoints/base/rollback"
			case "delete":
				method, path = "DELETE", "/v1/sandboxes/cp/checkpoints/base"
			case "fork":
				method, path, body = "POST", "/v1/sandboxes/cp/fork", map[string]any{"ids": []string{"cpfork"}}
			}
			if err := d.tryJSON(method, path, body); err == nil {
				t.Fatalf("%s %s answered: the server did not die at %s", method, path, s.at)
			}
			select {
			case <-d.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("bothyd did not die at %s", s.at)
			}
			d.env = nil
			d.start()

			got := ""
			waitFor(t, 30*time.Second, "the sandbox to answer after the restart", func() bool {
				st := d.doJSON("GET", "/v1/sandboxes/cp", nil)
				if st.Status == 200 && strings.Contains(string(st.Body), `"state":"stopped"`) {
					d.doJSON("POST", "/v1/sandboxes/cp/start", nil)
				}
				r := d.doJSON("POST", "/v1/sandboxes/cp/exec", map[string]any{"command": []string{"cat", "/home/user/f"}})
				got = string(r.Body)
				return r.Status == 200
			})
			if !strings.Contains(got, `"stdout":"base\n"`) && !strings.Contains(got, `"stdout":"later\n"`) {
				t.Fatalf("after the crash at %s the file is at neither point: %s", s.at, got)
			}
			if s.op == "rollback" && s.at != "rollback-stopped" && !strings.Contains(got, `"stdout":"base\n"`) {
				t.Fatalf("a rollback recorded before the crash at %s was not finished: %s", s.at, got)
			}
			if s.op == "fork" {
				if r := d.doJSON("GET", "/v1/sandboxes/cpfork", nil); r.Status != 404 {
					t.Fatalf("the fork interrupted at %s is still there: %d %s", s.at, r.Status, r.Body)
				}
			}
			mustCheckClean(t, d.Root, "after a crash at "+s.at+" and a restart")
		})
	}
}

// tryJSON sends a request and returns the transport's error, nil if anything answered.
func (d *daemon) tryJSON(method, path string, in any) error {
	d.t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	var body io.Reader
	if in != nil {
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, d.URL+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+d.Token)
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Timeout: 60 * time.Second, Transport: d.httpClient().Transport}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// TestFullRootLeftCheckpointRecordStopsAndDeletes: a checkpoint's copy that ran out of space
// on a full state root cannot write the manifest that clears its record (chaos, with the
// state root filled, found it): the record left must not refuse the stop or the delete that
// free space, while a start, which needs the chain settled, answers 507; once
// space is back, everything checks clean. It fails without the fix (the stop and the delete
// answered 507 storage-full).
func TestFullRootLeftCheckpointRecordStopsAndDeletes(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	small := newSmallFS(t, 64)
	root := filepath.Join(small.Dir, "root")
	d := startDaemon(t, func(d *daemon) { d.Root = root })
	for _, id := range []string{"fr-run", "fr-stopped"} {
		d.createNoDisk(id)
		d.rootSh(id, "echo kept > /home/user/f")
	}
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/fr-stopped/stop", nil), 200)
	for _, id := range []string{"fr-run", "fr-stopped"} {
		// The record a copy leaves when its undo cannot write the manifest: nothing else of it.
		dir := filepath.Join(root, "sandboxes", id, "checkpoints")
		if err := os.MkdirAll(filepath.Join(dir, "layers"), 0o700); err != nil {
			t.Fatal(err)
		}
		manifest := `{"format":1,"pending":{"op":"copy","name":"c","layer":"0123456789abcdef"}}`
		if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	filled := small.fill()

	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/fr-run/stop", nil), 200)
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/fr-stopped/start", nil), 507, "storage-full")
	if r := d.doJSON("DELETE", "/v1/sandboxes/fr-run", nil); r.Status != 204 {
		t.Fatalf("deleting a sandbox on a full state root: %d %s", r.Status, r.Body)
	}

	if err := os.Remove(filled); err != nil {
		t.Fatal(err)
	}
	// With space back, the start finishes the recovery: the files are as before the copy.
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/fr-stopped/start", nil), 200)
	if got := d.rootSh("fr-stopped", "cat /home/user/f"); got != "kept\n" {
		t.Fatalf("after the recovery the file reads %q", got)
	}
	if n := len(decode[struct{ Items []checkpointJSON }](t, d.doJSON("GET", "/v1/sandboxes/fr-stopped/checkpoints", nil), 200).Items); n != 0 {
		t.Fatalf("the undone copy left %d checkpoints", n)
	}
	mustCheckClean(t, root, "after the full state root was freed")
}

// TestFullRootCheckpointOfADiskIsStorageFull: a fork (or checkpoint) of a running sandbox with
// a disk of its own on a full state root answers 507 storage-full: the disk's image cannot grow, so the
// sync of its writes fails with EIO, which must not read as a state root failing its I/O
// (chaos, with the state root filled, found 503 storage-unavailable). It fails without the
// fix.
func TestFullRootCheckpointOfADiskIsStorageFull(t *testing.T) {
	requireRoot(t)
	if !disksSupported() {
		t.Skip("sandboxes with a disk of their own need loop devices and mke2fs")
	}
	t.Parallel()
	small := newSmallFS(t, 128)
	root := filepath.Join(small.Dir, "root")
	d := startDaemon(t, func(d *daemon) { d.Root = root })
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "frd", "start": true, "resources": map[string]any{"disk_mb": 64}}), 201)
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/frd?force=true", nil) })
	filled := small.fill()
	// Room for the checkpoint's records, not for the disk's writes: written into the disk's
	// page cache, they find no room for its image on the host when the checkpoint syncs them.
	runTool(t, "fallocate", "-p", "-o", "0", "-l", "256K", filled)
	d.rootSh("frd", "head -c 16777216 /dev/urandom > /home/user/big")
	// A fork: it records nothing before the sync (its staging layer is removed by the next
	// reattach), so the sync's EIO is all it meets. A checkpoint meets the same EIO, but its
	// undo's manifest write on the full root says ENOSPC as well.
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes/frd/fork", map[string]any{"count": 1}), 507, "storage-full")
	if err := os.Remove(filled); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the state root to read as ok again", func() bool { return d.storageState() == "ok" })
}

// TestForkOfASandboxWithAPolicy: a sandbox with a network policy of its own is forked, before
// and after a rollback; each fork runs with the source's policy and the source keeps its own.
func TestForkOfASandboxWithAPolicy(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// Its network is made in a namespace of the test's: a policy's filters and resolver are not
	// the host's business.
	w := newNetWorld(t)
	d := startDaemon(t, w.daemon())
	d.createNoDisk("psrc")
	if r := d.doJSON("PUT", "/v1/sandboxes/psrc/network", map[string]any{"allow": []string{"allowed.test"}}); r.Status != 200 {
		t.Fatalf("the policy: %d %s", r.Status, r.Body)
	}
	fork := func(fid string) {
		t.Helper()
		t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+fid+"?force=true", nil) })
		res := decode[forkJSON](t, d.doJSON("POST", "/v1/sandboxes/psrc/fork", map[string]any{"ids": []string{fid}}), 200)
		if len(res.Items) != 1 || res.Items[0].Error != nil || res.Items[0].Sandbox == nil || res.Items[0].Sandbox.State != "running" {
			t.Fatalf("fork %s: %+v", fid, res.Items)
		}
	}
	fork("pf1")
	decode[checkpointJSON](t, d.doJSON("POST", "/v1/sandboxes/psrc/checkpoints", map[string]any{"name": "before"}), 201)
	d.rootSh("psrc", "echo after > /tmp/after")
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/psrc/checkpoints/before/rollback", nil), 200)
	fork("pf2")
	// A fork whose id the server chooses, twice.
	for range 2 {
		res := decode[forkJSON](t, d.doJSON("POST", "/v1/sandboxes/psrc/fork", map[string]any{"count": 1}), 200)
		if len(res.Items) == 1 {
			t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+res.Items[0].ID+"?force=true", nil) })
		}
		if len(res.Items) != 1 || res.Items[0].Error != nil || res.Items[0].Sandbox == nil || res.Items[0].Sandbox.State != "running" {
			t.Fatalf("fork of count 1: %+v", res.Items)
		}
	}
	for _, id := range []string{"psrc", "pf1", "pf2"} {
		if got := d.rootSh(id, "cat /tmp/after 2>/dev/null || echo none"); got != "none\n" {
			t.Fatalf("%s reads %q", id, got)
		}
		// The policy is in force: its name resolves, another is refused.
		d.resolves(id, "allowed.test", netAllowed)
		d.refusedName(id, "other.test")
	}
	mustCheckCleanIn(t, w.host, d.Root, "after forks of a sandbox with a policy")
}
