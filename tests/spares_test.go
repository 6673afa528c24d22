package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// TestSpares: a server that keeps spares gives a create with start that names nothing a
// running sandbox at once, one of its spares, which no listing, lookup, operation or event
// showed before; the sandbox carries the create's labels and lifetime and its own id as its
// host name. A create that names anything of its own gets a sandbox of its own. A claimed
// spare is replaced. A SIGKILLed server's spares are kept by the next one, as many as it
// keeps, and the others deleted; a spare that dies is replaced at once; `bothyd check` finds
// them consistent; a server that stops leaves no spare behind, and no event ever named one.
func TestSpares(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--spares", "2"))
	first := waitSpares(t, d, 2)
	events := d.subscribe("0", false) // from the server's first event on

	if ids := listedIDs(t, d); len(ids) != 0 {
		t.Fatalf("the listing shows %v beside two spares; want nothing", ids)
	}
	for _, id := range first {
		for _, op := range []struct {
			method, path string
			body         any
		}{
			{"GET", "/v1/sandboxes/" + id, nil},
			{"POST", "/v1/sandboxes/" + id + "/exec", map[string]any{"command": []string{"true"}}},
			{"POST", "/v1/sandboxes/" + id + "/stop?force=true", nil},
			{"POST", "/v1/sandboxes/" + id + "/pause", nil},
			{"DELETE", "/v1/sandboxes/" + id + "?force=true", nil},
		} {
			if r := d.doJSON(op.method, op.path, op.body); r.Status != 404 {
				t.Fatalf("%s %s of a spare: %d %s; want 404", op.method, op.path, r.Status, r.Body)
			}
		}
	}

	sb := decode[claimedJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"start": true, "labels": map[string]string{"team": "a"}, "timeout_s": 600}), 201)
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+sb.ID+"?force=true", nil) })
	if !slices.Contains(first, sb.ID) {
		t.Fatalf("a create that names nothing got %s, none of the spares %v", sb.ID, first)
	}
	if sb.State != "running" || sb.Labels["team"] != "a" || sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) < 9*time.Minute {
		t.Fatalf("the claimed spare: %+v; want running, labelled team=a, expiring in about 10 minutes", sb)
	}
	if got := d.exec(sb.ID, map[string]any{"command": []string{"hostname"}}); got.Stdout != sb.ID+"\n" {
		t.Fatalf("the claimed spare's host name: %+v; want %s", got, sb.ID)
	}
	if ids := listedIDs(t, d); !slices.Equal(ids, []string{sb.ID}) {
		t.Fatalf("the listing after the claim: %v; want only %s", ids, sb.ID)
	}
	if e := events.next(sb.ID); e.Type != "sandbox.created" {
		t.Fatalf("the first event of the claimed spare: %s; want sandbox.created", e.Type)
	}
	if e := events.next(sb.ID); e.Type != "sandbox.started" {
		t.Fatalf("the second event of the claimed spare: %s; want sandbox.started", e.Type)
	}

	second := waitSpares(t, d, 2)
	kept := slices.DeleteFunc(slices.Clone(first), func(id string) bool { return id == sb.ID })
	if slices.Contains(second, sb.ID) || !slices.Contains(second, kept[0]) {
		t.Fatalf("the spares after a claim of %s: %v; want %s and a new one", sb.ID, second, kept[0])
	}

	// A spare that dies is replaced at once, not when a claim finds it dead.
	killed := second[0]
	if err := platform.SignalVerified(shimProcess(t, d, killed).ID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the killed spare "+killed+" to be deleted", func() bool {
		_, err := os.Lstat(filepath.Join(d.Root, "sandboxes", killed))
		return os.IsNotExist(err)
	})
	second = waitSpares(t, d, 2)
	if slices.Contains(second, killed) {
		t.Fatalf("the killed spare %s is still among the spares %v", killed, second)
	}

	// What names anything of its own is no spare's to give.
	own := d.create("own-id", true)
	env := decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"start": true, "env": []string{"A=1"}}), 201)
	m := d.scrape()
	if m[`bothy_spares{kind="wanted"}`] != 2 || m[`bothy_spares{kind="ready"}`] != 2 ||
		m[`bothy_spare_creates_total{result="claimed"}`] != 1 || m[`bothy_spare_creates_total{result="missed"}`] != 0 ||
		m[`bothy_sandboxes{state="running"}`] != 3 {
		t.Fatalf("the metrics after one claim and two creates of their own, with both spares ready: %v", m)
	}
	t.Cleanup(func() { d.doJSON("DELETE", "/v1/sandboxes/"+env.ID+"?force=true", nil) })
	if got := d.exec(env.ID, map[string]any{"command": []string{"sh", "-c", "echo $A"}}); got.Stdout != "1\n" {
		t.Fatalf("a create with an environment: %+v", got)
	}
	if now := waitSpares(t, d, 2); !slices.Equal(now, second) || slices.Contains(second, env.ID) || own.ID != "own-id" {
		t.Fatalf("creates that named an id and an environment took spares: %v before, %v after (%s, %s)", second, now, own.ID, env.ID)
	}

	// A crash leaves the spares to the next server, which keeps as many as it wants.
	d.Args = []string{"--spares", "1"}
	d.Restart(true)
	third := waitSpares(t, d, 1)
	if !slices.Contains(second, third[0]) {
		t.Fatalf("the spare kept after a crash is %s, none of %v", third[0], second)
	}
	for _, id := range second {
		if id == third[0] {
			continue
		}
		waitFor(t, 30*time.Second, "the spare not kept, "+id+", to be deleted", func() bool {
			_, err := os.Lstat(filepath.Join(d.Root, "sandboxes", id))
			return os.IsNotExist(err)
		})
	}
	for _, id := range []string{sb.ID, own.ID, env.ID} {
		if got := d.exec(id, map[string]any{"command": []string{"true"}}); got.ExitCode != 0 {
			t.Fatalf("exec in %s after the crash: %+v", id, got)
		}
	}
	if report, code, stderr := runCheck(t, d.Root); code != 0 || report.Spares != 1 || report.Sandboxes != 4 {
		t.Fatalf("bothyd check beside a spare: exit %d, %+v %s; want 4 sandboxes, 1 of them a spare", code, report, stderr)
	}

	// A server that stops deletes its spares.
	d.Stop()
	if left := spareIDs(t, d.Root); len(left) != 0 {
		t.Fatalf("spares left by a server that stopped: %v", left)
	}
	for _, p := range listProcesses(t, d.Root) {
		if id := filepath.Base(p.Dir); !slices.Contains([]string{sb.ID, own.ID, env.ID}, id) {
			t.Fatalf("a runtime process of %s is left after the server stopped: %+v", id, p)
		}
	}
	all := append(append(append(slices.Clone(first), second...), third...), killed)
	for ended := false; !ended; {
		select {
		case e, ok := <-events.events:
			ended = !ok
			if ok && e.Event.Sandbox != nil && *e.Event.Sandbox != sb.ID && slices.Contains(all, *e.Event.Sandbox) {
				t.Fatalf("an event named the spare %s: %s", *e.Event.Sandbox, e.Type)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the event stream did not end with the server")
		}
	}

	// A server that keeps none makes none (and serves the clean-up of the sandboxes above).
	d.Args = []string{"--spares", "0"}
	d.start()
	d.create("after", true)
	if left := spareIDs(t, d.Root); len(left) != 0 {
		t.Fatalf("a server with --spares 0 made spares: %v", left)
	}
}

// waitSpares waits until the server keeps exactly n spares that run, and returns their ids.
func waitSpares(t *testing.T, d *daemon, n int) []string {
	t.Helper()
	var ids []string
	waitFor(t, 60*time.Second, "the server to keep its spares", func() bool {
		ids = ids[:0]
		shims := map[string]bool{}
		for _, p := range listProcesses(t, d.Root) {
			if p.Role == runtime.RoleShim {
				shims[filepath.Base(p.Dir)] = true
			}
		}
		for _, id := range spareIDs(t, d.Root) {
			dir := filepath.Join(d.Root, "sandboxes", id)
			_, rec := os.Lstat(filepath.Join(dir, "runtime.json"))
			_, pending := os.Lstat(filepath.Join(dir, "create.pending"))
			if rec == nil && os.IsNotExist(pending) && shims[id] {
				ids = append(ids, id)
			}
		}
		return len(ids) == n && len(spareIDs(t, d.Root)) == n
	})
	return ids
}

// spareIDs are the sandboxes of the state root whose configuration marks them spares.
func spareIDs(t *testing.T, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(root, "sandboxes", e.Name(), "config.json"))
		var cfg struct {
			Spare bool `json:"spare"`
		}
		if err == nil && json.Unmarshal(b, &cfg) == nil && cfg.Spare {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// claimedJSON is what the test reads of a claimed spare.
type claimedJSON struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Labels    map[string]string `json:"labels"`
	ExpiresAt *time.Time        `json:"expires_at"`
}

// listedIDs are the ids of the server's listing.
func listedIDs(t *testing.T, d *daemon) []string {
	t.Helper()
	type page struct {
		Items []struct {
			ID string `json:"id"`
		} `json:"items"`
	}
	ids := []string{}
	for _, it := range decode[page](t, d.do("GET", "/v1/sandboxes", nil, nil), 200).Items {
		ids = append(ids, it.ID)
	}
	return ids
}
