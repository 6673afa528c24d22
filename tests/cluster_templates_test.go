package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// TestClusterTemplateGenerations: two real nodes sharing a template registry, behind real
// routers. A template captured on node A is listed in A's BothyNode; clones of it through a
// router that name only the template go to A first, though B has more room (placement
// prefers the holder of the template's current generation); once A is full the next clone
// goes to B, which pulls the generation (one download) and then lists it. A newer capture on
// A is the template's current generation: a clone goes to A again, though B holds an older
// generation and has more room, and once A is full B pulls the newer one and lists it first.
// A tombstone on A and a retirement on B take the generation off that node's list.
func TestClusterTemplateGenerations(t *testing.T) {
	requireRoot(t)
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	reg := newCountingRegistry(t)
	const nodeToken, routerToken, slots = "node-token-0123456789abcdef", "router-token-0123456789abcdef", 3
	start := func(name string) *daemon {
		// Memory and CPU to spare: the slots alone decide the room.
		return startClusterNode(t, cp, admin, name, withToken(nodeToken), withArgs("--cluster-max-sandboxes", fmt.Sprint(slots),
			"--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100", "--template-registry", reg.repo()))
	}
	a, b := start("tmpl-a"), start("tmpl-b")
	// waitListed waits until the node's BothyNode lists exactly gens (newest first) and
	// has free slots.
	waitListed := func(name string, free int32, gens ...string) {
		t.Helper()
		want := make([]v1alpha1.Generation, len(gens))
		for i, g := range gens {
			want[i] = v1alpha1.Generation{Template: "tools", Generation: g}
		}
		waitObject(t, admin, fmt.Sprintf("%s to list %v with %d slots free", name, gens, free), client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
			if !slices.Equal(n.Status.Generations, want) || n.Status.Free.Sandboxes != free {
				return fmt.Errorf("generations %v, %d slots free", n.Status.Generations, n.Status.Free.Sandboxes)
			}
			return nil
		})
	}
	clone := func(router, id string) cloneJSON {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"id": id, "template": "tools"})
		req, _ := http.NewRequestWithContext(ctx, "POST", router+"/v1/sandboxes", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+routerToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("clone %s: %v", id, err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		var c cloneJSON
		if resp.StatusCode != 201 || json.Unmarshal(got, &c) != nil {
			t.Fatalf("clone %s through the router: %d %s", id, resp.StatusCode, got)
		}
		return c
	}
	// on says which node holds id, asking both directly.
	on := func(id string) string {
		t.Helper()
		var holders []string
		for name, d := range map[string]*daemon{"tmpl-a": a, "tmpl-b": b} {
			if r := d.doJSON("GET", "/v1/sandboxes/"+id, nil); r.Status == 200 {
				holders = append(holders, name)
			}
		}
		if len(holders) != 1 {
			t.Fatalf("%s is on %v, want one node", id, holders)
		}
		return holders[0]
	}
	wantClone := func(router, id, node, gen string) {
		t.Helper()
		c := clone(router, id)
		if got := on(id); got != node || c.Template == nil || c.Template.Generation != gen {
			t.Fatalf("clone %s went to %s as %+v; want %s, generation %s", id, got, c.Template, node, gen)
		}
	}

	g1 := a.buildTemplate("tools") // its source sandbox takes one of A's slots
	reg.waitTagged(t, "tools."+g1.ID)
	waitListed("tmpl-a", slots-1, g1.ID)
	waitListed("tmpl-b", slots)
	// The router starts now, so that its first read of the nodes sees A's list.
	r1 := startRouter(t, cp, routerToken, nodeToken)

	// B has more room each time; A holds the generation.
	wantClone(r1, "t1", "tmpl-a", g1.ID)
	wantClone(r1, "t2", "tmpl-a", g1.ID)
	// A is full: B takes the next, pulling the generation once, and lists it.
	before := reg.blobGets.Load()
	wantClone(r1, "t3", "tmpl-b", g1.ID)
	if got := reg.blobGets.Load() - before; got != 2 {
		t.Fatalf("B's clone downloaded %d blobs, want 2 (one pull: configuration and payload)", got)
	}
	waitListed("tmpl-b", slots-1, g1.ID)

	// A newer capture on A. A frees a slot; B, holding only the older generation, has two.
	g2 := decode[generationJSON](t, a.doJSON("POST", "/v1/templates/tools/generations", map[string]any{"sandbox": "tools-src"}), 201)
	reg.waitTagged(t, "tools."+g2.ID)
	if r := a.doJSON("DELETE", "/v1/sandboxes/t2?force=true", nil); r.Status != 204 {
		t.Fatalf("delete t2: %d %s", r.Status, r.Body)
	}
	waitListed("tmpl-a", 1, g2.ID, g1.ID)
	r2 := startRouter(t, cp, routerToken, nodeToken)
	wantClone(r2, "t4", "tmpl-a", g2.ID)
	// A is full again: B pulls the current generation, though it holds an older one.
	before = reg.blobGets.Load()
	wantClone(r2, "t5", "tmpl-b", g2.ID)
	if got := reg.blobGets.Load() - before; got != 2 {
		t.Fatalf("B's clone of the newer generation downloaded %d blobs, want 2 (one pull)", got)
	}
	waitListed("tmpl-b", slots-2, g2.ID, g1.ID)

	// A tombstone and a retirement leave the lists at once (the clones keep their leases).
	if r := a.doJSON("POST", "/v1/templates/tools/generations/"+g2.ID+"/tombstone", nil); r.Status != 200 {
		t.Fatalf("tombstone %s on A: %d %s", g2.ID, r.Status, r.Body)
	}
	waitListed("tmpl-a", 0, g1.ID)
	if r := b.doJSON("DELETE", "/v1/templates/tools/generations/"+g1.ID+"?drain=true", nil); r.Status != 202 {
		t.Fatalf("retire %s on B with drain: %d %s", g1.ID, r.Status, r.Body)
	}
	waitListed("tmpl-b", slots-2, g2.ID)
}
