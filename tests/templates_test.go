package tests

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

type generationJSON struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	Eligibility string `json:"eligibility"`
	Leases      int    `json:"leases"`
	SizeBytes   int64  `json:"size_bytes"`
}

type cloneJSON struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Template *struct {
		Template   string `json:"template"`
		Generation string `json:"generation"`
		Lease      string `json:"lease"`
	} `json:"template"`
}

// buildTemplate makes a sandbox, installs a tool and removes a file in it, stops it, and
// captures it as a generation of a new template.
func (d *daemon) buildTemplate(name string) generationJSON {
	d.t.Helper()
	src := name + "-src"
	d.create(src, true)
	got := d.exec(src, map[string]any{"user": "root", "command": []string{"sh", "-c",
		"mkdir -p /opt/tool && printf '#!/bin/sh\\necho tool says $1\\n' > /opt/tool/run && chmod 755 /opt/tool/run && rm /etc/hostname"}})
	if got.ExitCode != 0 {
		d.t.Fatalf("preparing the template source: %+v", got)
	}
	if r := d.doJSON("POST", "/v1/sandboxes/"+src+"/stop", nil); r.Status != 200 {
		d.t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	if r := d.doJSON("POST", "/v1/templates", map[string]any{"name": name}); r.Status != 201 {
		d.t.Fatalf("create template: %d %s", r.Status, r.Body)
	}
	return decode[generationJSON](d.t, d.doJSON("POST", "/v1/templates/"+name+"/generations", map[string]any{"sandbox": src}), 201)
}

// TestTemplateWalkthrough is the README's: build a template, clone 10 sandboxes, retire.
func TestTemplateWalkthrough(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	g := d.buildTemplate("tools")
	if g.State != "active" || g.Eligibility != "eligible" || g.SizeBytes <= 0 {
		t.Fatalf("captured generation %+v", g)
	}

	const clones = 10
	for i := range clones {
		id := fmt.Sprintf("clone%d", i)
		c := decode[cloneJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "template": "tools", "start": true}), 201)
		if c.State != "running" || c.Template == nil || c.Template.Generation != g.ID || c.Template.Lease == "" {
			t.Fatalf("clone %+v", c)
		}
		got := d.exec(id, map[string]any{"command": []string{"sh", "-c", "/opt/tool/run " + id + "; test -e /etc/hostname && echo hostname-is-back"}})
		if got.Stdout != "tool says "+id+"\n" {
			t.Fatalf("%s sees %q: the generation's files (or its whiteout) did not come through", id, got.Stdout)
		}
		// A clone's changes are its own.
		d.exec(id, map[string]any{"command": []string{"sh", "-c", "echo mine > /home/user/" + id}})
	}
	if got := d.exec("clone0", map[string]any{"command": []string{"sh", "-c", "ls /home/user"}}); strings.TrimSpace(got.Stdout) != "clone0" {
		t.Fatalf("clone0 sees other clones' files: %q", got.Stdout)
	}
	leases := decode[struct {
		Items []struct{ Sandbox string } `json:"items"`
	}](t, d.do("GET", "/v1/templates/tools/generations/"+g.ID+"/leases", nil, nil), 200)
	if len(leases.Items) != clones {
		t.Fatalf("%d leases, want %d", len(leases.Items), clones)
	}

	// Retiring while clones lease it: 423 naming them, and nothing changed.
	events := d.subscribe("", false)
	p := wantProblem(t, d.doJSON("DELETE", "/v1/templates/tools/generations/"+g.ID, nil), 423, "generation-leased")
	if !strings.Contains(p.Detail, "clone3") {
		t.Fatalf("generation-leased does not name the clones: %s", p.Detail)
	}
	wantProblem(t, d.doJSON("DELETE", "/v1/templates/tools", nil), 423, "generation-leased")
	if still := decode[generationJSON](t, d.do("GET", "/v1/templates/tools/generations/"+g.ID, nil, nil), 200); still.State != "active" || still.Eligibility != "eligible" {
		t.Fatalf("a refused retirement changed the generation: %+v", still)
	}

	// Drain: 202 with the generation, retiring, and it goes when the last clone does.
	retiring := decode[generationJSON](t, d.doJSON("DELETE", "/v1/templates/tools/generations/"+g.ID+"?drain=true", nil), 202)
	if retiring.State != "retiring" || retiring.Eligibility != "retiring" || retiring.Leases != clones {
		t.Fatalf("retire with drain answered %+v", retiring)
	}
	if e := events.nextOf("generation.tombstoned"); e.Event.Generation == nil || *e.Event.Generation != g.ID {
		t.Fatalf("the drain's tombstone event: %+v", e.Event)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "late", "template": "tools", "generation": g.ID}), 409, "template-tombstoned")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "late", "template": "tools"}), 409, "template-ineligible")
	// Existing clones keep working.
	if got := d.exec("clone5", map[string]any{"command": []string{"/opt/tool/run", "still"}}); got.Stdout != "tool says still\n" {
		t.Fatalf("a clone of a retiring generation: %+v", got)
	}
	for i := range clones {
		id := fmt.Sprintf("clone%d", i)
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		if r := d.doJSON("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
		if i < clones-1 {
			if r := d.do("GET", "/v1/templates/tools/generations/"+g.ID, nil, nil); r.Status != 200 {
				t.Fatalf("the generation went while %d clones remain: %d", clones-1-i, r.Status)
			}
		}
	}
	wantProblem(t, d.do("GET", "/v1/templates/tools/generations/"+g.ID, nil, nil), 404, "generation-not-found")
	if e := events.nextOf("generation.retired"); e.Event.Generation == nil || *e.Event.Generation != g.ID {
		t.Fatalf("the end of the drain's retirement event: %+v", e.Event)
	}
	if r := d.doJSON("DELETE", "/v1/templates/tools", nil); r.Status != 204 {
		t.Fatalf("delete template: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("GET", "/v1/templates/tools", nil, nil), 404, "template-not-found")
}

// TestTemplateErrors covers the template codes of the error table.
func TestTemplateErrors(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	g := d.buildTemplate("errs")

	wantProblem(t, d.doJSON("POST", "/v1/templates", map[string]any{"name": "errs"}), 409, "template-exists")
	wantProblem(t, d.do("GET", "/v1/templates/nope", nil, nil), 404, "template-not-found")
	wantProblem(t, d.do("GET", "/v1/templates/errs/generations/g999999", nil, nil), 404, "generation-not-found")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"template": "nope"}), 404, "template-not-found")
	wantProblem(t, d.doJSON("POST", "/v1/templates/errs/generations", map[string]any{"sandbox": "nope"}), 404, "sandbox-not-found")
	// A clone chooses its resources (the namespace runtime does not pin them); what it
	// leaves out is the generation's.
	var small struct {
		Resources struct {
			Vcpus    int `json:"vcpus"`
			MemoryMB int `json:"memory_mb"`
			Pids     int `json:"pids"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "small", "template": "errs", "start": true, "resources": map[string]any{"memory_mb": 64}}).Body, &small); err != nil ||
		small.Resources.MemoryMB != 64 || small.Resources.Pids == 0 || small.Resources.Vcpus == 0 {
		t.Fatalf("a clone with memory_mb 64: %+v (%v)", small, err)
	}
	limit := cgroupFile(t, d, "small", "memory.max")
	if limit == "" {
		limit = cgroupFile(t, d, "small", "memory.limit_in_bytes") // cgroup v1
	}
	if limit != "67108864" {
		t.Fatalf("the clone's memory limit reads %q, want 64 MiB", limit)
	}
	d.dispose("small")

	// A clone's generation cannot be deleted with its template while the clone exists.
	d.create("unused", false)
	c := decode[cloneJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "kid", "template": "errs"}), 201)
	t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/kid/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/kid", nil)
	})
	if c.Template == nil || c.Template.Generation != g.ID {
		t.Fatalf("clone %+v", c)
	}
	wantProblem(t, d.doJSON("DELETE", "/v1/templates/errs", nil), 423, "generation-leased")

	// Tombstone: no new clones of it; existing ones keep their lease.
	tomb := decode[generationJSON](t, d.doJSON("POST", "/v1/templates/errs/generations/"+g.ID+"/tombstone", nil), 200)
	if tomb.State != "tombstoned" || tomb.Leases != 1 {
		t.Fatalf("tombstoned generation %+v", tomb)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"template": "errs", "generation": g.ID}), 409, "template-tombstoned")
	if r := d.doJSON("POST", "/v1/sandboxes/kid/start", nil); r.Status != 200 {
		t.Fatalf("a clone of a tombstoned generation must still start: %d %s", r.Status, r.Body)
	}
}

// TestTemplateIneligibleWhenExpired: a generation past the server's maximum age is shown as
// expired and cannot be cloned.
func TestTemplateIneligibleWhenExpired(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--template-max-age", "1s"))
	g := d.buildTemplate("old")
	waitFor(t, 20*time.Second, "the generation to expire", func() bool {
		var got generationJSON
		return json.Unmarshal(d.do("GET", "/v1/templates/old/generations/"+g.ID, nil, nil).Body, &got) == nil && got.Eligibility == "expired"
	})
	p := wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"template": "old"}), 409, "template-ineligible")
	if !strings.Contains(p.Detail, "expired") {
		t.Fatalf("the refusal does not say the generation expired: %s", p.Detail)
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"template": "old", "generation": g.ID}), 409, "template-ineligible")
}

// TestClonesSurviveRestart: leases and bindings are durable; a restarted server starts a
// clone and releases its lease on delete.
func TestClonesSurviveRestart(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	g := d.buildTemplate("durable")
	decode[cloneJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "c1", "template": "durable", "start": true}), 201)
	d.Restart(true)
	if got := d.exec("c1", map[string]any{"command": []string{"/opt/tool/run", "after"}}); got.Stdout != "tool says after\n" {
		t.Fatalf("clone after restart: %+v", got)
	}
	d.doJSON("POST", "/v1/sandboxes/c1/stop", nil)
	if r := d.doJSON("DELETE", "/v1/sandboxes/c1", nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	if got := decode[generationJSON](t, d.do("GET", "/v1/templates/durable/generations/"+g.ID, nil, nil), 200); got.Leases != 0 {
		t.Fatalf("the lease outlived its clone: %+v", got)
	}
	if r := d.doJSON("DELETE", "/v1/templates/durable/generations/"+g.ID, nil); r.Status != 204 {
		t.Fatalf("retire: %d %s", r.Status, r.Body)
	}
}

// TestCaptureOfAClone: a clone changed and captured makes a generation that stands alone: its
// clones see the first generation's files with the clone's changes over them, deletions
// included (of the generation's files and of the host image's), and the first generation can
// be retired while they run.
func TestCaptureOfAClone(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	first := d.buildTemplate("tools") // /opt/tool/run, and /etc/hostname deleted
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "layer", "template": "tools", "start": true})
	if got := d.exec("layer", map[string]any{"user": "root", "command": []string{"sh", "-c",
		"mkdir -p /opt/more && echo second > /opt/more/file && printf '#!/bin/sh\\necho tool v2 says $1\\n' > /opt/tool/run && rm /etc/os-release"}}); got.ExitCode != 0 {
		t.Fatalf("changing the clone: %+v", got)
	}
	d.mustStatus(200, "POST", "/v1/sandboxes/layer/stop", nil)
	d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": "tools2"})
	second := decode[generationJSON](t, d.doJSON("POST", "/v1/templates/tools2/generations", map[string]any{"sandbox": "layer"}), 201)
	if second.SizeBytes <= first.SizeBytes {
		t.Fatalf("the clone's generation (%d bytes) holds no more than the first (%d)", second.SizeBytes, first.SizeBytes)
	}
	d.mustStatus(204, "DELETE", "/v1/sandboxes/layer", nil)

	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "grandchild", "template": "tools2", "start": true})
	t.Cleanup(func() { d.dispose("grandchild") })
	check := func(when string) {
		t.Helper()
		got := d.exec("grandchild", map[string]any{"command": []string{"sh", "-c",
			"/opt/tool/run x; cat /opt/more/file; test -e /etc/hostname && echo hostname-is-back; test -e /etc/os-release && echo os-release-is-back; true"}})
		if got.Stdout != "tool v2 says x\nsecond\n" {
			t.Fatalf("%s, a clone of the clone's generation sees %q", when, got.Stdout)
		}
	}
	check("at once")
	// It leases only its own generation: the first one retires now, and nothing changes.
	if r := d.doJSON("DELETE", "/v1/templates/tools/generations/"+first.ID, nil); r.Status != 204 && r.Status != 202 {
		t.Fatalf("retiring the first generation: %d %s", r.Status, r.Body)
	}
	d.mustStatus(200, "POST", "/v1/sandboxes/grandchild/stop", nil)
	d.mustStatus(200, "POST", "/v1/sandboxes/grandchild/start", nil)
	check("after the first generation was retired")
}
