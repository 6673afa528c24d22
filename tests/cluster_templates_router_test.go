package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// TestClusterTemplatesThroughRouter: bothy's template calls through a real router in front of
// two real nodes sharing a template registry (docs/cluster.md, "Templates"). A template made
// through the router is made on both nodes; a capture through the router, of a sandbox on
// node A, goes to A; the router lists and reads the template and its generation; clones
// through the router land on A, then (A full) on B, which pulls the generation; the merged
// read counts the leases of both nodes' clones; a tombstone through the router reaches both
// holders; a delete is refused while clones lease the generation, then, once they are gone,
// removes the template from both nodes.
func TestClusterTemplatesThroughRouter(t *testing.T) {
	requireRoot(t)
	cp, admin, _ := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	reg := newCountingRegistry(t)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	start := func(name string) *daemon {
		// Two slots each: the capture's source and one clone fill A.
		return startClusterNode(t, cp, admin, name, withToken(nodeToken), withArgs("--cluster-max-sandboxes", "2",
			"--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100", "--template-registry", reg.repo()))
	}
	nodes := map[string]*daemon{"tr-a": start("tr-a"), "tr-b": start("tr-b")}
	a := nodes["tr-a"]
	rt := &daemon{t: t, URL: startRouter(t, cp, routerToken, nodeToken), Token: routerToken}
	on := func(id string) string {
		t.Helper()
		var holders []string
		for name, d := range nodes {
			if r := d.doJSON("GET", "/v1/sandboxes/"+id, nil); r.Status == 200 {
				holders = append(holders, name)
			}
		}
		if len(holders) != 1 {
			t.Fatalf("%s is on %v, want one node", id, holders)
		}
		return holders[0]
	}

	// The source sandbox is on A (made there directly); the template is made through the router.
	a.create("tools-src", true)
	if got := a.exec("tools-src", map[string]any{"user": "root", "command": []string{"sh", "-c",
		"mkdir -p /opt/tool && printf '#!/bin/sh\\necho tool says $1\\n' > /opt/tool/run && chmod 755 /opt/tool/run"}}); got.ExitCode != 0 {
		t.Fatalf("preparing the template source: %+v", got)
	}
	if r := a.doJSON("POST", "/v1/sandboxes/tools-src/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	if r := rt.doJSON("POST", "/v1/templates", map[string]any{"name": "tools"}); r.Status != 201 {
		t.Fatalf("create the template through the router: %d %s", r.Status, r.Body)
	}
	for name, d := range nodes {
		if r := d.doJSON("GET", "/v1/templates/tools", nil); r.Status != 200 {
			t.Fatalf("the template made through the router on %s: %d %s", name, r.Status, r.Body)
		}
	}
	if r := rt.doJSON("POST", "/v1/templates", map[string]any{"name": "tools"}); r.Status != 409 || problemCode(r.Body) != "template-exists" {
		t.Fatalf("a second create through the router: %d %s, want 409 template-exists", r.Status, r.Body)
	}

	// The capture through the router goes to the sandbox's node.
	g := decode[generationJSON](t, rt.doJSON("POST", "/v1/templates/tools/generations", map[string]any{"sandbox": "tools-src"}), 201)
	if r := a.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil); r.Status != 200 {
		t.Fatalf("the generation captured through the router on tr-a: %d %s", r.Status, r.Body)
	}
	if r := nodes["tr-b"].doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil); r.Status != 404 {
		t.Fatalf("the generation on tr-b before any clone there: %d %s, want 404", r.Status, r.Body)
	}
	reg.waitTagged(t, "tools."+g.ID)
	waitObject(t, admin, "tr-a listing "+g.ID, client.ObjectKey{Name: "tr-a"}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if !slices.Contains(n.Status.Generations, v1alpha1.Generation{Template: "tools", Generation: g.ID}) {
			return fmt.Errorf("generations %v", n.Status.Generations)
		}
		return nil
	})

	// Reads through the router.
	list := decode[struct {
		Items []struct {
			Name        string `json:"name"`
			Latest      string `json:"latest"`
			Generations int    `json:"generations"`
		} `json:"items"`
	}](t, rt.doJSON("GET", "/v1/templates", nil), 200)
	if len(list.Items) != 1 || list.Items[0].Name != "tools" || list.Items[0].Latest != g.ID || list.Items[0].Generations != 1 {
		t.Fatalf("the template list through the router: %+v, want tools at %s", list.Items, g.ID)
	}
	if tm := decode[struct {
		Latest string `json:"latest"`
	}](t, rt.doJSON("GET", "/v1/templates/tools", nil), 200); tm.Latest != g.ID {
		t.Fatalf("the template through the router: latest %q, want %s", tm.Latest, g.ID)
	}
	gens := decode[struct{ Items []generationJSON }](t, rt.doJSON("GET", "/v1/templates/tools/generations", nil), 200)
	if len(gens.Items) != 1 || gens.Items[0].ID != g.ID || gens.Items[0].State != "active" {
		t.Fatalf("the generations through the router: %+v", gens.Items)
	}

	// Clones through the router: A holds the generation and takes the first; full, it
	// leaves the second to B, which pulls the generation.
	for _, c := range []struct{ id, node string }{{"clone-1", "tr-a"}, {"clone-2", "tr-b"}} {
		cl := decode[cloneJSON](t, rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": c.id, "template": "tools", "start": true}), 201)
		if got := on(c.id); got != c.node || cl.Template == nil || cl.Template.Generation != g.ID {
			t.Fatalf("%s went to %s as %+v; want %s, generation %s", c.id, got, cl.Template, c.node, g.ID)
		}
		if got := rt.exec(c.id, map[string]any{"command": []string{"/opt/tool/run", "hi"}}); got.ExitCode != 0 || !strings.Contains(got.Stdout, "tool says hi") {
			t.Fatalf("the template's tool in %s through the router: %+v", c.id, got)
		}
	}
	if got := decode[generationJSON](t, rt.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil), 200); got.Leases != 2 {
		t.Fatalf("the generation through the router leases %d clones, want 2 (one on each node)", got.Leases)
	}
	if got := decode[struct{ Items []any }](t, rt.doJSON("GET", "/v1/templates/tools/generations/"+g.ID+"/leases", nil), 200); len(got.Items) != 2 {
		t.Fatalf("the leases through the router: %d, want 2", len(got.Items))
	}

	// A tombstone through the router reaches both holders.
	if got := decode[generationJSON](t, rt.doJSON("POST", "/v1/templates/tools/generations/"+g.ID+"/tombstone", nil), 200); got.State != "tombstoned" {
		t.Fatalf("the tombstone through the router: %+v", got)
	}
	for name, d := range nodes {
		if got := decode[generationJSON](t, d.doJSON("GET", "/v1/templates/tools/generations/"+g.ID, nil), 200); got.State != "tombstoned" {
			t.Fatalf("%s after the tombstone through the router: %+v", name, got)
		}
	}

	// Leased: the delete is refused. Without the clones it removes the template everywhere.
	if r := rt.doJSON("DELETE", "/v1/templates/tools", nil); r.Status != 423 || problemCode(r.Body) != "generation-leased" {
		t.Fatalf("the delete of a leased template through the router: %d %s, want 423 generation-leased", r.Status, r.Body)
	}
	for _, id := range []string{"clone-1", "clone-2"} {
		if r := rt.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	if r := rt.doJSON("DELETE", "/v1/templates/tools", nil); r.Status != 204 {
		t.Fatalf("the delete through the router: %d %s", r.Status, r.Body)
	}
	for name, d := range nodes {
		if r := d.doJSON("GET", "/v1/templates/tools", nil); r.Status != 404 {
			t.Fatalf("tools on %s after the delete through the router: %d %s", name, r.Status, r.Body)
		}
	}
	if r := rt.doJSON("GET", "/v1/templates/tools", nil); r.Status != 404 || problemCode(r.Body) != "template-not-found" {
		t.Fatalf("the deleted template through the router: %d %s, want 404 template-not-found", r.Status, r.Body)
	}
}
