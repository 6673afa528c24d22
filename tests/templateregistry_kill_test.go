package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestTemplateRegistryKilled kills the template registry, a process of its own
// (registryprocess_test.go), with SIGKILL in the middle of a push and in the middle of a
// pull, and starts it again on its storage:
//
//   - mid-push: node A's capture answered (the push runs in the background); the push
//     fails with a reason shown in the generation's registry state, never hangs; A's
//     template store checks clean; once the registry is back a new capture's push succeeds,
//     A's next sweep (its start-up's here) pushes the cut generation again, and node B
//     clones both.
//   - node A killed mid-push: A's store checks clean, its restart's sweep pushes the
//     generation, and B clones it.
//   - mid-pull: node B's clone of a generation it lacks answers 503 registry-unavailable
//     within a deadline, never hangs; B's template store checks clean (the pull's staging
//     is gone); once the registry is back the same clone pulls the generation and runs.
//
// Both nodes' template stores check clean at the end, and so does `bothyd check --cluster`
// (the nodes are cluster nodes of a real kube-apiserver). It is the registry's half of the
// issue's chaos (docs/cluster.md, "Template generations across nodes" and the failure
// cases): TestChaos kills bothyd, the runtime and its helpers on one node, and
// TestTemplatePullKilled kills the pulling bothyd.
func TestTemplateRegistryKilled(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	// Two cluster nodes, so that the cluster-wide check judges them at the end.
	cp, admin, _ := startInstalledCluster(t, 5*time.Minute, clusterNodeUser)
	const nodeToken = "node-token-0123456789abcdef"
	reg := startRegistryProcess(t)
	args := withArgs("--template-registry", reg.repo())
	a := startClusterNode(t, cp, admin, "reg-a", withToken(nodeToken), args)
	b := startClusterNode(t, cp, admin, "reg-b", withToken(nodeToken), args)

	// A source with an 8 MiB file: a blob of its own, large enough to stall in.
	a.create("big-src", true)
	if got := a.exec("big-src", map[string]any{"user": "root", "command": []string{"sh", "-c", "head -c 8388608 /dev/urandom > /opt/big && echo ok"}}); got.ExitCode != 0 {
		t.Fatalf("preparing the source: %+v", got)
	}
	if r := a.doJSON("POST", "/v1/sandboxes/big-src/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	if r := a.doJSON("POST", "/v1/templates", map[string]any{"name": "big"}); r.Status != 201 {
		t.Fatalf("create template: %d %s", r.Status, r.Body)
	}
	type pushedJSON struct {
		ID       string `json:"id"`
		Registry *struct {
			State string `json:"state"`
			Error string `json:"error"`
		} `json:"registry"`
	}
	pushState := func(gen string) (state, why string) {
		g := decode[pushedJSON](t, a.doJSON("GET", "/v1/templates/big/generations/"+gen, nil), 200)
		if g.Registry == nil {
			return "", ""
		}
		return g.Registry.State, g.Registry.Error
	}
	templatesClean := func(d *daemon, when string) {
		t.Helper()
		rep, _, stderr := runCheck(t, d.Root)
		if ps := templateEntryProblems(rep); len(ps) != 0 {
			t.Fatalf("check of %s's template store %s: %+v (%s)", d.Root, when, ps, stderr)
		}
	}

	// Mid-push.
	reg.setStall("push")
	g1 := decode[generationJSON](t, a.doJSON("POST", "/v1/templates/big/generations", map[string]any{"sandbox": "big-src"}), 201)
	reg.waitStalled("push")
	reg.kill()
	waitFor(t, 2*time.Minute, "the cut push to fail", func() bool { st, _ := pushState(g1.ID); return st == "failed" })
	// Its reason is the code and one sentence naming the cause once.
	if _, why := pushState(g1.ID); !strings.HasPrefix(why, "registry-unavailable: ") || strings.Count(why, "/v2/") > 1 {
		t.Fatalf("the failed push's reason: %q, want registry-unavailable and its cause once", why)
	} else {
		t.Logf("the cut push: %s", why)
	}
	templatesClean(a, "after the registry was killed mid-push")
	reg.setStall("")
	reg.start()
	if st := reg.manifestStatus("big." + g1.ID); st != http.StatusNotFound {
		t.Fatalf("the cut push's manifest after the registry came back: GET %d, want 404", st)
	}
	// A new capture pushes at once; the cut push is pushed again by A's next sweep (every
	// 5 minutes, and at start-up: a restart here).
	g2 := decode[generationJSON](t, a.doJSON("POST", "/v1/templates/big/generations", map[string]any{"sandbox": "big-src"}), 201)
	waitFor(t, 2*time.Minute, "the push after the registry came back", func() bool { st, _ := pushState(g2.ID); return st == "pushed" })
	if st := reg.manifestStatus("big." + g2.ID); st != http.StatusOK {
		t.Fatalf("the new capture's manifest: GET %d, want 200", st)
	}
	a.Restart(false)
	waitFor(t, 2*time.Minute, "A's start-up sweep to push the generation whose push was cut", func() bool {
		return reg.manifestStatus("big."+g1.ID) == http.StatusOK
	})
	waitFor(t, time.Minute, "the pushed-again generation's state", func() bool { st, _ := pushState(g1.ID); return st == "pushed" })

	// Mid-pull: B's clone waits on the pull; the registry dies under it.
	reg.setStall("pull")
	type answer struct {
		status int
		body   string
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		body := strings.NewReader(`{"id":"b1","template":"big","generation":"` + g2.ID + `"}`)
		req, _ := http.NewRequest("POST", b.URL+"/v1/sandboxes", body)
		req.Header.Set("Authorization", "Bearer "+b.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		answered <- answer{status: resp.StatusCode, body: string(data)}
	}()
	reg.waitStalled("pull")
	reg.kill()
	var got answer
	select {
	case got = <-answered:
	case <-time.After(2 * time.Minute):
		t.Fatal("the clone cut by the registry's death has not answered after 2 minutes")
	}
	var p struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	}
	if got.err != nil || got.status != http.StatusServiceUnavailable || json.Unmarshal([]byte(got.body), &p) != nil || p.Code != "registry-unavailable" {
		t.Fatalf("the clone cut mid-pull: %d %s %v, want 503 registry-unavailable", got.status, got.body, got.err)
	}
	t.Logf("the cut clone: %d %s: %s", got.status, p.Code, p.Detail)
	wantProblem(t, b.doJSON("GET", "/v1/templates/big/generations/"+g2.ID, nil), 404, "generation-not-found") // the pull left no generation
	templatesClean(b, "after the registry was killed mid-pull")

	reg.setStall("")
	reg.start()
	c := decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b1", "template": "big", "generation": g2.ID, "start": true}), 201)
	if c.Template == nil || c.Template.Generation != g2.ID {
		t.Fatalf("the retried clone: %+v", c)
	}
	if got := b.exec("b1", map[string]any{"user": "root", "command": []string{"sh", "-c", "test $(wc -c < /opt/big) -eq 8388608 && echo ok"}}); got.ExitCode != 0 {
		t.Fatalf("the clone's file from the pulled generation: %+v", got)
	}
	// And the generation whose push was cut clones on B too.
	decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b2", "template": "big", "generation": g1.ID}), 201)

	// The node killed mid-push: its store checks clean, and its restart's sweep pushes the
	// generation (the registry drops the upload session the dead node left).
	// New content, so that the push has a blob to upload (the registry has the others).
	if r := a.doJSON("POST", "/v1/sandboxes/big-src/start", nil); r.Status != 200 {
		t.Fatalf("start big-src: %d %s", r.Status, r.Body)
	}
	if got := a.exec("big-src", map[string]any{"user": "root", "command": []string{"sh", "-c", "head -c 8388608 /dev/urandom > /opt/big3"}}); got.ExitCode != 0 {
		t.Fatalf("new content in the source: %+v", got)
	}
	if r := a.doJSON("POST", "/v1/sandboxes/big-src/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	reg.setStall("push")
	g3 := decode[generationJSON](t, a.doJSON("POST", "/v1/templates/big/generations", map[string]any{"sandbox": "big-src"}), 201)
	reg.waitStalled("push")
	a.Kill()
	templatesClean(a, "after A was killed mid-push")
	reg.setStall("")
	a.start()
	waitFor(t, 2*time.Minute, "A's start-up sweep to push the generation it was pushing when it died", func() bool {
		return reg.manifestStatus("big."+g3.ID) == http.StatusOK
	})
	decode[cloneJSON](t, b.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "b3", "template": "big", "generation": g3.ID}), 201)
	templatesClean(a, "at the end")
	templatesClean(b, "at the end")
	// The cluster-wide check: every node's store against the Sandbox objects (the nodes
	// write their objects within moments of a change and of a restart's reconcile).
	checker := newClusterChecker(t, cp, nodeToken)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		rep, code := checker.run()
		if code == 0 && len(rep.Problems) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bothyd check --cluster after a minute: exit %d, problems %v", code, kinds(rep, false))
		}
	}
}
