package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/cluster/router"
)

// TestClusterVolumes: volumes through a router (docs/cluster.md, "Volumes"). Two real nodes
// and a real router. A volume made through the router lives on one node, which lists it in
// its BothyNode; its files are written and read through the router; a second create of the
// name answers volume-exists; every sandbox that mounts it is placed on its node (the nodes
// are equal, so placement alone would spread them) and sees its files; a sandbox that mounts
// volumes of two nodes is refused with volumes-apart; the list spans the nodes; a volume
// whose node's lease lapsed answers 503 node-lost; and a delete through the router reaches
// the volume's node (refused while mounted, 423 volume-in-use, then done).
func TestClusterVolumes(t *testing.T) {
	requireRoot(t)
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	nodes := map[string]*daemon{}
	for _, name := range []string{"vol-a", "vol-b"} {
		nodes[name] = startClusterNode(t, cp, admin, name, withToken(nodeToken),
			withArgs("--cluster-max-sandboxes", "20", "--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	rt := &daemon{t: t, URL: startRouter(t, cp, routerToken, nodeToken), Token: routerToken}
	listed := func(volume string) string {
		t.Helper()
		holder := ""
		for name := range nodes {
			waitObject(t, admin, name+"'s volumes", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
				if slices.Contains(n.Status.Volumes, volume) {
					holder = name
				}
				return nil
			})
		}
		return holder
	}

	if r := rt.doJSON("POST", "/v1/volumes", map[string]any{"name": "data", "size_mb": 64}); r.Status != 201 {
		t.Fatalf("create data through the router: %d %s", r.Status, r.Body)
	}
	var home string
	waitCond(t, 30*time.Second, "a node listing data in its BothyNode", func() (bool, error) {
		home = listed("data")
		return home != "", nil
	})
	away := "vol-a"
	if home == away {
		away = "vol-b"
	}
	if r := nodes[home].doJSON("GET", "/v1/volumes/data", nil); r.Status != 200 {
		t.Fatalf("data on %s, its BothyNode says: %d %s", home, r.Status, r.Body)
	}
	if r := nodes[away].doJSON("GET", "/v1/volumes/data", nil); r.Status != 404 {
		t.Fatalf("data on %s as well: %d %s", away, r.Status, r.Body)
	}
	wantProblem(t, rt.doJSON("POST", "/v1/volumes", map[string]any{"name": "data"}), 409, "volume-exists")

	if r := rt.do("PUT", "/v1/volumes/data/files?path=/hello", strings.NewReader("written through the router\n"),
		map[string][]string{"Content-Type": {"application/octet-stream"}}); r.Status/100 != 2 {
		t.Fatalf("write a file of data through the router: %d %s", r.Status, r.Body)
	}
	if r := rt.do("GET", "/v1/volumes/data/files?path=/hello", nil, nil); r.Status != 200 || string(r.Body) != "written through the router\n" {
		t.Fatalf("read it back through the router: %d %q", r.Status, r.Body)
	}

	// A volume of the other node, made there directly.
	if r := nodes[away].doJSON("POST", "/v1/volumes", map[string]any{"name": "far", "size_mb": 64}); r.Status != 201 {
		t.Fatalf("create far on %s: %d %s", away, r.Status, r.Body)
	}
	waitCond(t, 30*time.Second, away+" listing far", func() (bool, error) { return listed("far") == away, nil })
	list := decode[struct{ Items []struct{ Name string } }](t, rt.doJSON("GET", "/v1/volumes", nil), 200)
	var names []string
	for _, v := range list.Items {
		names = append(names, v.Name)
	}
	if !slices.Equal(names, []string{"data", "far"}) {
		t.Fatalf("the volumes through the router: %v, want [data far]", names)
	}

	// Every sandbox mounting data lands on its node and reads what the router wrote.
	for i := range 4 {
		id := fmt.Sprintf("mounts-%d", i)
		if r := rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true,
			"volumes": []map[string]any{{"name": "data", "path": "/mnt/data"}}}); r.Status != 201 {
			t.Fatalf("create %s mounting data: %d %s", id, r.Status, r.Body)
		}
		if r := nodes[home].doJSON("GET", "/v1/sandboxes/"+id, nil); r.Status != 200 {
			t.Fatalf("%s is not on %s, data's node: %d", id, home, r.Status)
		}
		if out := rt.rootSh(id, "cat /mnt/data/hello"); out != "written through the router\n" {
			t.Fatalf("%s reads %q from data", id, out)
		}
	}
	// Without volumes, placement spreads over the equal nodes.
	for i := range 4 {
		if r := rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": fmt.Sprintf("free-%d", i)}); r.Status != 201 {
			t.Fatalf("create free-%d: %d %s", i, r.Status, r.Body)
		}
	}
	if r := nodes[away].doJSON("GET", "/v1/sandboxes?limit=100", nil); !strings.Contains(string(r.Body), `"free-`) {
		t.Fatalf("no sandbox without volumes on %s: placement did not spread them, so the volumes' rule is not shown: %s", away, r.Body)
	}
	p := wantProblem(t, rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "both",
		"volumes": []map[string]any{{"name": "data", "path": "/mnt/data"}, {"name": "far", "path": "/mnt/far"}}}), 409, router.CodeVolumesApart)
	if !strings.Contains(p.Detail, home) || !strings.Contains(p.Detail, away) {
		t.Fatalf("volumes-apart does not name both nodes: %s", p.Detail)
	}
	for _, n := range nodes {
		if r := n.doJSON("GET", "/v1/sandboxes/both", nil); r.Status != 404 {
			t.Fatalf("the refused sandbox was made: %d", r.Status)
		}
	}

	// Delete through the router reaches the volume's node: refused while mounted.
	p = wantProblem(t, rt.doJSON("DELETE", "/v1/volumes/data", nil), 423, "volume-in-use")
	if !strings.Contains(p.Detail, "mounts-0") {
		t.Fatalf("volume-in-use does not name its sandboxes: %s", p.Detail)
	}
	for i := range 4 {
		if r := rt.doJSON("DELETE", fmt.Sprintf("/v1/sandboxes/mounts-%d?force=true", i), nil); r.Status != 204 {
			t.Fatalf("delete mounts-%d: %d %s", i, r.Status, r.Body)
		}
	}
	if r := rt.doJSON("DELETE", "/v1/volumes/data", nil); r.Status != 204 {
		t.Fatalf("delete data through the router: %d %s", r.Status, r.Body)
	}
	wantProblem(t, rt.doJSON("GET", "/v1/volumes/data", nil), 404, "volume-not-found")

	// far's node dies: far answers node-lost, not 404, once the lease lapses.
	nodes[away].Kill()
	// Until the lease lapses the router finds the node silent (502, outside the contract the
	// node's own answers keep): waited for on the lease, then asked once.
	waitCond(t, 30*time.Second, away+"'s lease lapsed", func() (bool, error) {
		var l coordinationv1.Lease
		err := admin.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: node.LeaseName(away)}, &l)
		if err != nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			return false, err
		}
		return !node.LeaseLive(l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, time.Now()), nil
	})
	p = wantProblem(t, rt.doJSON("GET", "/v1/volumes/far", nil), 503, router.CodeNodeLost)
	if !strings.Contains(p.Detail, away) {
		t.Fatalf("node-lost does not name the node: %s", p.Detail)
	}
	wantProblem(t, rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "late",
		"volumes": []map[string]any{{"name": "far", "path": "/mnt/far"}}}), 503, router.CodeNodeLost)
}
