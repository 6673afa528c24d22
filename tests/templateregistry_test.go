package tests

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
)

// countingRegistry is go-containerregistry's in-memory registry (pkg/registry) on loopback,
// counting the blob downloads it serves.
type countingRegistry struct {
	srv      *httptest.Server
	blobGets atomic.Int64
}

func newCountingRegistry(t testing.TB) *countingRegistry {
	t.Helper()
	cr := &countingRegistry{}
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	cr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
			cr.blobGets.Add(1)
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(cr.srv.Close)
	return cr
}

func (cr *countingRegistry) repo() string {
	return strings.TrimPrefix(cr.srv.URL, "http://") + "/bothy/templates"
}

// waitTagged waits until the registry serves the manifest of tag: a capture's push runs in
// the background.
func (cr *countingRegistry) waitTagged(t testing.TB, tag string) {
	t.Helper()
	waitManifest(t, cr.srv.URL, tag, nil)
}

// waitManifest waits until the registry at base serves the manifest of the templates' tag
// (a HEAD answered 200): a capture's push runs in the background. auth, if not nil, is
// applied to each request.
func waitManifest(t testing.TB, base, tag string, auth func(*http.Request)) {
	t.Helper()
	waitCond(t, 2*time.Minute, "the capture's push of "+tag, func() (bool, error) {
		req, err := http.NewRequest("HEAD", base+"/v2/bothy/templates/manifests/"+tag, nil)
		if err != nil {
			return false, err
		}
		if auth != nil {
			auth(req)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil // the registry is restarted by some tests: ask again
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// manifestStatus is the status of a GET of the manifest tag names.
func (cr *countingRegistry) manifestStatus(t testing.TB, tag string) int {
	t.Helper()
	resp, err := http.Get(cr.srv.URL + "/v2/bothy/templates/manifests/" + tag)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// marks are the nodes' marks on generation tag in the registry (tags "<tag>.held-<id>").
func (cr *countingRegistry) marks(t testing.TB, tag string) []string {
	t.Helper()
	resp, err := http.Get(cr.srv.URL + "/v2/bothy/templates/tags/list")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Tags []string `json:"tags"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tg := range list.Tags {
		if strings.HasPrefix(tg, tag+".held-") {
			out = append(out, tg)
		}
	}
	return out
}

// TestTemplateRegistryTwoNodes: two bothyds share a registry. A generation captured on A is
// cloned on B (B pulls it once, for two clones at once; its files are the capture's); a
// later clone on B downloads nothing; with the registry stopped, B's clone of the
// generation it holds works and a clone of a generation it would have to pull answers 503
// registry-unavailable.
func TestTemplateRegistryTwoNodes(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	reg := newCountingRegistry(t)
	a := startDaemon(t, withArgs("--template-registry", reg.repo()))
	b := startDaemon(t, withArgs("--template-registry", reg.repo()))

	g := a.buildTemplate("tools")
	reg.waitTagged(t, "tools."+g.ID)
	type pushJSON struct {
		Registry *struct {
			State  string `json:"state"`
			Digest string `json:"digest"`
			Error  string `json:"error"`
		} `json:"registry"`
	}
	pushOf := func(d *daemon, gen string) pushJSON {
		return decode[pushJSON](t, d.doJSON("GET", "/v1/templates/tools/generations/"+gen, nil), 200)
	}
	waitFor(t, time.Minute, "A to say the push is done", func() bool {
		p := pushOf(a, g.ID)
		return p.Registry != nil && p.Registry.State == "pushed"
	})
	if p := pushOf(a, g.ID); !strings.HasPrefix(p.Registry.Digest, "sha256:") {
		t.Fatalf("A's pushed generation: %+v", *p.Registry)
	}

	// Two clones at once on B: one pull, which both wait for.
	before := reg.blobGets.Load()
	var wg sync.WaitGroup
	responses := make([]response, 2)
	for i, id := range []string{"b1", "b2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			responses[i] = b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "template": "tools", "generation": g.ID, "start": true})
		}()
	}
	wg.Wait()
	results := []cloneJSON{decode[cloneJSON](t, responses[0], 201), decode[cloneJSON](t, responses[1], 201)}
	if got := reg.blobGets.Load() - before; got != 2 {
		t.Fatalf("two concurrent clones on B downloaded %d blobs, want 2 (one pull: configuration and payload)", got)
	}
	for _, c := range results {
		if c.State != "running" || c.Template == nil || c.Template.Generation != g.ID {
			t.Fatalf("clone on B: %+v", c)
		}
		got := b.exec(c.ID, map[string]any{"command": []string{"sh", "-c", "/opt/tool/run " + c.ID + "; test -e /etc/hostname && echo hostname-is-back"}})
		if got.Stdout != "tool says "+c.ID+"\n" {
			t.Fatalf("%s on B sees %q: the capture's files (or its whiteout) did not come through", c.ID, got.Stdout)
		}
	}
	gb := decode[generationJSON](t, b.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil), 200)
	if gb.State != "active" || gb.Leases != 2 || gb.SizeBytes != g.SizeBytes {
		t.Fatalf("the pulled generation on B: %+v (captured: %+v)", gb, g)
	}

	// A later clone on B pulls nothing.
	before = reg.blobGets.Load()
	decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b3", "template": "tools", "generation": g.ID, "start": true}), 201)
	if got := reg.blobGets.Load() - before; got != 0 {
		t.Fatalf("a clone of a generation B holds downloaded %d blobs", got)
	}

	// The registry stops. A's next capture cannot be pushed, B cannot pull it.
	reg.srv.Close()
	g2 := decode[generationJSON](t, a.doJSON("POST", "/v1/templates/tools/generations", map[string]any{"sandbox": "tools-src"}), 201)
	decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b4", "template": "tools", "generation": g.ID, "start": true}), 201)
	waitFor(t, time.Minute, "A to say the second push failed", func() bool {
		p := pushOf(a, g2.ID)
		return p.Registry != nil && p.Registry.State == "failed" && p.Registry.Error != ""
	})
	if p := pushOf(b, g.ID); p.Registry != nil {
		t.Fatalf("B, which pulled the generation, reports a push: %+v", *p.Registry)
	}
	p := wantProblem(t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b5", "template": "tools", "generation": g2.ID}), 503, "registry-unavailable")
	if !strings.Contains(p.Detail, "template registry") {
		t.Fatalf("the 503 says %q", p.Detail)
	}
	if r := b.doJSON("GET", "/v1/sandboxes/b5", nil); r.Status != 404 {
		t.Fatalf("the refused clone left a sandbox: %d %s", r.Status, r.Body)
	}
	// Leases and retirement hold on the pulled generation as on a captured one.
	wantProblem(t, b.doJSON("DELETE", "/v1/templates/tools/generations/"+g.ID, nil), 423, "generation-leased")
	for _, id := range []string{"b1", "b2", "b3", "b4"} {
		if r := b.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	if r := b.doJSON("DELETE", "/v1/templates/tools/generations/"+g.ID, nil); r.Status != 204 {
		t.Fatalf("retire the pulled generation once its clones are gone: %d %s", r.Status, r.Body)
	}
}

// TestTemplatePullKilled kills the pulling bothyd with SIGKILL in the middle of a
// generation's payload, twice: the first time `bothyd check` reports the staging directory
// the pull left (a generation no clone can use) and `--repair` removes it; the second time
// the next start removes it by itself; and the clone, retried, pulls and runs.
func TestTemplatePullKilled(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	var stall atomic.Bool
	srv := stallingRegistry(t, &stall)
	repo := strings.TrimPrefix(srv.URL, "http://") + "/bothy/templates"
	a := startDaemon(t, withArgs("--template-registry", repo))
	b := startDaemon(t, withArgs("--template-registry", repo))

	a.create("big-src", true)
	if got := a.exec("big-src", map[string]any{"user": "root", "command": []string{"sh", "-c", "head -c 8388608 /dev/urandom > /opt/big && echo ok"}}); got.ExitCode != 0 {
		t.Fatalf("preparing the source: %+v", got)
	}
	a.doJSON("POST", "/v1/sandboxes/big-src/stop", nil)
	if r := a.doJSON("POST", "/v1/templates", map[string]any{"name": "big"}); r.Status != 201 {
		t.Fatalf("create template: %d %s", r.Status, r.Body)
	}
	g := decode[generationJSON](t, a.doJSON("POST", "/v1/templates/big/generations", map[string]any{"sandbox": "big-src"}), 201)
	waitManifest(t, srv.URL, "big."+g.ID, nil)

	stall.Store(true)
	staging := func() bool {
		entries, _ := os.ReadDir(filepath.Join(b.Root, "templates", "big"))
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "."+g.ID+".") && strings.HasSuffix(e.Name(), ".tmp") {
				return true
			}
		}
		return false
	}
	cloneUntilStalled := func() {
		t.Helper()
		// The clone's request hangs with the pull; its answer is lost with the server.
		go func() {
			body := strings.NewReader(`{"id":"b1","template":"big","generation":"` + g.ID + `"}`)
			req, _ := http.NewRequest("POST", b.URL+"/v1/sandboxes", body)
			req.Header.Set("Authorization", "Bearer "+b.Token)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		waitFor(t, time.Minute, "the pull to be in the middle of the payload", staging)
	}
	templateProblems := func(rep checkReport) []checkProblem {
		var out []checkProblem
		for _, p := range rep.Problems {
			if strings.HasPrefix(p.Entry, "templates/") {
				out = append(out, p)
			}
		}
		return out
	}

	cloneUntilStalled()
	b.Kill()
	rep, code, stderr := runCheck(t, b.Root)
	left := false
	for _, p := range templateProblems(rep) {
		left = left || p.Kind == "staging-leftover"
	}
	if code != 1 || !left {
		t.Fatalf("check after a kill mid-pull: exit %d, problems %+v (%s); want a staging leftover", code, rep.Problems, stderr)
	}
	// Judged by the template store's entries alone: the host's nftables are shared with
	// every other test, whose leftovers check reports too.
	rep, _, stderr = runCheck(t, b.Root, "--repair")
	for _, p := range templateProblems(rep) {
		if !p.Repaired {
			t.Fatalf("check --repair left %+v (%s)", p, stderr)
		}
	}
	if staging() {
		t.Fatal("check --repair left the pull's staging directory")
	}

	b.start()
	cloneUntilStalled()
	b.Kill()
	b.start()
	if rep, _, stderr := runCheck(t, b.Root); len(templateProblems(rep)) != 0 || staging() {
		t.Fatalf("the start after a kill mid-pull left %+v (%s)", templateProblems(rep), stderr)
	}

	stall.Store(false)
	decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b2", "template": "big", "generation": g.ID, "start": true}), 201)
	if got := b.exec("b2", map[string]any{"command": []string{"sh", "-c", "wc -c < /opt/big"}}); strings.TrimSpace(got.Stdout) != "8388608" {
		t.Fatalf("the clone after the kills sees %+v", got)
	}
}

// TestTemplateRegistryRetirement: a generation retired on the node that made it is retired
// in the cluster. Its tombstone goes to the registry; a node that lacks the generation
// refuses to pull it; a node that holds a copy with a clone drains it at its next sweep (at
// start-up here): no new clone, the running one keeps working, and its deletion deletes
// the copy. The registry's copy stays while B's clone holds its lease (B's mark is the one
// left); once B's copy is gone the registry's is deleted (GET of the manifest 404), and a
// clone of it on C still answers 409 template-tombstoned.
func TestTemplateRegistryRetirement(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	reg := newCountingRegistry(t)
	args := withArgs("--template-registry", reg.repo())
	a, b, c := startDaemon(t, args), startDaemon(t, args), startDaemon(t, args)

	g := a.buildTemplate("tools")
	reg.waitTagged(t, "tools."+g.ID)
	decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b1", "template": "tools", "generation": g.ID, "start": true}), 201)

	if r := a.doJSON("DELETE", "/v1/templates/tools/generations/"+g.ID, nil); r.Status != 204 {
		t.Fatalf("retire on A: %d %s", r.Status, r.Body)
	}
	reg.waitTagged(t, "tools."+g.ID+".tombstone")
	// A's copy is gone (no lease held it): its mark goes, B's stays, and so does the copy.
	waitFor(t, time.Minute, "A's mark to go", func() bool { return len(reg.marks(t, "tools."+g.ID)) == 1 })
	if st := reg.manifestStatus(t, "tools."+g.ID); st != http.StatusOK {
		t.Fatalf("the registry's copy while B's clone holds a lease: GET %d, want 200", st)
	}

	// C lacks it: the pull is refused, nothing is downloaded.
	before := reg.blobGets.Load()
	wantProblem(t, c.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "c1", "template": "tools", "generation": g.ID}), 409, "template-tombstoned")
	if got := reg.blobGets.Load() - before; got != 0 {
		t.Fatalf("a refused pull of a retired generation downloaded %d blobs", got)
	}

	// B holds a copy, leased by b1: its sweep at start-up drains it.
	b.Stop()
	b.start()
	waitFor(t, time.Minute, "B to drain its copy", func() bool {
		return decode[generationJSON](t, b.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil), 200).State == "retiring"
	})
	wantProblem(t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b2", "template": "tools", "generation": g.ID}), 409, "template-tombstoned")
	if got := b.exec("b1", map[string]any{"command": []string{"/opt/tool/run", "still"}}); got.Stdout != "tool says still\n" {
		t.Fatalf("the clone of a draining generation: %+v", got)
	}
	b.doJSON("POST", "/v1/sandboxes/b1/stop?force=true", nil)
	if r := b.doJSON("DELETE", "/v1/sandboxes/b1", nil); r.Status != 204 {
		t.Fatalf("delete b1: %d %s", r.Status, r.Body)
	}
	wantProblem(t, b.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil), 404, "generation-not-found")

	// No node holds a copy: the registry's is deleted; its tombstone stays.
	waitFor(t, time.Minute, "the registry's copy to be deleted", func() bool {
		return reg.manifestStatus(t, "tools."+g.ID) == http.StatusNotFound
	})
	if m := reg.marks(t, "tools."+g.ID); len(m) != 0 {
		t.Fatalf("marks left after the deletion: %v", m)
	}
	if st := reg.manifestStatus(t, "tools."+g.ID+".tombstone"); st != http.StatusOK {
		t.Fatalf("the tombstone after the deletion: GET %d, want 200", st)
	}
	wantProblem(t, c.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "c2", "template": "tools", "generation": g.ID}), 409, "template-tombstoned")
}

// TestTemplateRegistryCurrentGeneration: a clone that names a template and no generation, on
// a node that holds none of it (it was captured on another node), pulls the registry's
// current generation; after a newer capture on the origin the next such clone pulls that
// one; with the registry stopped the node goes on with the newest it holds, and a node that
// holds nothing of the template answers 503 registry-unavailable.
func TestTemplateRegistryCurrentGeneration(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	reg := newCountingRegistry(t)
	a := startDaemon(t, withArgs("--template-registry", reg.repo()))
	b := startDaemon(t, withArgs("--template-registry", reg.repo()))
	c := startDaemon(t, withArgs("--template-registry", reg.repo()))

	wantProblem(t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b0", "template": "tools"}), 404, "template-not-found")
	g1 := a.buildTemplate("tools")
	reg.waitTagged(t, "tools."+g1.ID)
	clone := func(d *daemon, id string) cloneJSON {
		t.Helper()
		return decode[cloneJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "template": "tools", "start": true}), 201)
	}
	before := reg.blobGets.Load()
	if got := clone(b, "b1"); got.Template == nil || got.Template.Generation != g1.ID {
		t.Fatalf("a clone of the template on B, which held none of it: %+v, want generation %s", got, g1.ID)
	}
	if got := reg.blobGets.Load() - before; got != 2 {
		t.Fatalf("B's first clone downloaded %d blobs, want 2 (one pull)", got)
	}
	if got := b.exec("b1", map[string]any{"command": []string{"/opt/tool/run", "b1"}}); got.Stdout != "tool says b1\n" {
		t.Fatalf("the pulled clone sees %+v", got)
	}

	// A newer capture on A is the template's current generation: B's next clone pulls it.
	g2 := decode[generationJSON](t, a.doJSON("POST", "/v1/templates/tools/generations", map[string]any{"sandbox": "tools-src"}), 201)
	reg.waitTagged(t, "tools."+g2.ID)
	before = reg.blobGets.Load()
	if got := clone(b, "b2"); got.Template == nil || got.Template.Generation != g2.ID {
		t.Fatalf("a clone after a newer capture: %+v, want generation %s", got, g2.ID)
	}
	if got := reg.blobGets.Load() - before; got != 2 {
		t.Fatalf("the clone of the newer generation downloaded %d blobs, want 2 (one pull)", got)
	}
	// Held now: no download.
	before = reg.blobGets.Load()
	clone(b, "b3")
	if got := reg.blobGets.Load() - before; got != 0 {
		t.Fatalf("a clone of the current generation B holds downloaded %d blobs", got)
	}

	reg.srv.Close()
	if got := clone(b, "b4"); got.Template == nil || got.Template.Generation != g2.ID {
		t.Fatalf("with the registry down, B's clone: %+v, want its newest, %s", got, g2.ID)
	}
	wantProblem(t, c.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "c1", "template": "tools"}), 503, "registry-unavailable")
	if r := c.doJSON("GET", "/v1/sandboxes/c1", nil); r.Status != 404 {
		t.Fatalf("the refused clone left a sandbox: %d %s", r.Status, r.Body)
	}
}

// TestTemplateRegistryReleaseCrash: B is killed (SIGKILL) once its last copy of a generation
// retired in the cluster is gone and before it lets go of its mark in the registry: the
// registry's copy stays while the mark is there, and the sweep at B's next start removes
// the mark and deletes the copy.
func TestTemplateRegistryReleaseCrash(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	bin := crashBothyd(t)
	reg := newCountingRegistry(t)
	args := withArgs("--template-registry", reg.repo())
	a, b := startDaemon(t, args), startDaemon(t, args, withBinary(bin))

	g := a.buildTemplate("tools")
	tag := "tools." + g.ID
	reg.waitTagged(t, tag)
	decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b1", "template": "tools", "generation": g.ID}), 201)
	if r := a.doJSON("DELETE", "/v1/templates/tools/generations/"+g.ID, nil); r.Status != 204 {
		t.Fatalf("retire on A: %d %s", r.Status, r.Body)
	}
	reg.waitTagged(t, tag+".tombstone")
	waitFor(t, time.Minute, "A's mark to go", func() bool { return len(reg.marks(t, tag)) == 1 })

	// B, with its crash point set, drains its copy at start-up; deleting b1 ends the drain
	// and B dies before it tells the registry.
	b.Stop()
	b.env = []string{"BOTHYD_CRASH_AT=registry-release"}
	b.start()
	waitFor(t, time.Minute, "B to drain its copy", func() bool {
		return decode[generationJSON](t, b.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil), 200).State == "retiring"
	})
	_ = b.tryJSON("DELETE", "/v1/sandboxes/b1", nil) // the answer may be cut off by the crash
	select {
	case <-b.done:
	case <-time.After(time.Minute):
		t.Fatal("bothyd B did not die at registry-release")
	}
	if m := reg.marks(t, tag); len(m) != 1 {
		t.Fatalf("marks after B died before letting go: %v, want B's", m)
	}
	if st := reg.manifestStatus(t, tag); st != http.StatusOK {
		t.Fatalf("the registry's copy while B's mark is there: GET %d, want 200", st)
	}

	b.env = nil
	b.start()
	waitFor(t, time.Minute, "B's start-up sweep to delete the registry's copy", func() bool {
		return reg.manifestStatus(t, tag) == http.StatusNotFound
	})
	if m := reg.marks(t, tag); len(m) != 0 {
		t.Fatalf("marks left after B's sweep: %v", m)
	}
	wantProblem(t, b.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil), 404, "generation-not-found")
}

// TestTemplateRegistryTombstoneCrash kills bothyd A with SIGKILL after it tombstoned a
// generation here and before it told the registry (crash point registry-tombstone): the
// tombstone is in A's outbox, not in the registry, and `bothyd check` notes it; A's next
// start pushes it, and B, which holds a copy, tombstones its copy at its next sweep. The
// second half does the same with the retirement of another generation, pushed by
// `bothyd check --repair --template-registry` while A is down.
func TestTemplateRegistryTombstoneCrash(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	bin := crashBothyd(t)
	reg := newCountingRegistry(t)
	args := withArgs("--template-registry", reg.repo())
	a, b := startDaemon(t, args, withBinary(bin)), startDaemon(t, args)

	g := a.buildTemplate("tools")
	tag := "tools." + g.ID
	reg.waitTagged(t, tag)
	decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b1", "template": "tools", "generation": g.ID}), 201)

	a.Stop()
	a.env = []string{"BOTHYD_CRASH_AT=registry-tombstone"}
	a.start()
	_ = a.tryJSON("POST", "/v1/templates/tools/generations/"+g.ID+"/tombstone", nil) // answered before the crash, or cut off by it
	select {
	case <-a.done:
	case <-time.After(time.Minute):
		t.Fatal("bothyd A did not die at registry-tombstone")
	}
	if st := reg.manifestStatus(t, tag+".tombstone"); st != http.StatusNotFound {
		t.Fatalf("the registry's tombstone after A died before pushing it: GET %d, want 404", st)
	}
	// The check is judged by the template store's entries: the network objects are the
	// host's, which other tests share.
	rep, _, stderr := runCheck(t, a.Root)
	pending := false
	for _, n := range rep.Notes {
		pending = pending || (n.Kind == "template-tombstone-pending" && strings.Contains(n.Detail, g.ID))
	}
	if ps := templateEntryProblems(rep); len(ps) != 0 || !pending {
		t.Fatalf("check of A's root with the tombstone in its outbox: problems %+v, notes %+v (%s); want no template problem and a pending note", ps, rep.Notes, stderr)
	}

	a.env = nil
	a.start()
	reg.waitTagged(t, tag+".tombstone")
	b.Restart(false) // B's start-up sweep applies the registry's tombstones
	waitFor(t, time.Minute, "B to tombstone its copy", func() bool {
		return decode[generationJSON](t, b.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil), 200).State == "tombstoned"
	})

	// A retirement whose push is cut by the crash, pushed by check --repair while A is down.
	g2 := decode[generationJSON](t, a.doJSON("POST", "/v1/templates/tools/generations", map[string]any{"sandbox": "tools-src"}), 201)
	tag2 := "tools." + g2.ID
	reg.waitTagged(t, tag2)
	a.Stop()
	a.env = []string{"BOTHYD_CRASH_AT=registry-tombstone"}
	a.start()
	_ = a.tryJSON("DELETE", "/v1/templates/tools/generations/"+g2.ID, nil)
	select {
	case <-a.done:
	case <-time.After(time.Minute):
		t.Fatal("bothyd A did not die at registry-tombstone (retirement)")
	}
	if st := reg.manifestStatus(t, tag2+".tombstone"); st != http.StatusNotFound {
		t.Fatalf("the registry's tombstone of the retirement after A died: GET %d, want 404", st)
	}
	rep, _, stderr = runCheck(t, a.Root, "--repair", "--template-registry", reg.repo())
	if ps := templateEntryProblems(rep); len(ps) != 0 {
		t.Fatalf("check --repair --template-registry: problems %+v (%s)", ps, stderr)
	}
	if st := reg.manifestStatus(t, tag2+".tombstone"); st != http.StatusOK {
		t.Fatalf("the registry's tombstone of the retirement after check --repair: GET %d, want 200 (%s)", st, stderr)
	}
	if rep, _, stderr = runCheck(t, a.Root); len(templateEntryProblems(rep)) != 0 || slices.ContainsFunc(rep.Notes, func(n checkProblem) bool { return n.Kind == "template-tombstone-pending" }) {
		t.Fatalf("check after the repair pushed the outbox: problems %+v, notes %+v (%s)", rep.Problems, rep.Notes, stderr)
	}
	a.env = nil
	a.start() // for the cleanup of its sandbox
}

// templateEntryProblems are the problems of a check report in the template store.
func templateEntryProblems(rep checkReport) []checkProblem {
	var out []checkProblem
	for _, p := range rep.Problems {
		if strings.HasPrefix(p.Entry, "templates/") || strings.HasPrefix(p.Kind, "template") {
			out = append(out, p)
		}
	}
	return out
}
