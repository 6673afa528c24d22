package tests

import (
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// TestClusterImages: images through a router (docs/cluster.md, "Images and templates"). Two
// real nodes, a real router and a registry on loopback. A pull through the router pulls on
// both nodes, and the router's read says ready once both are; sandboxes of it spread over
// both; once one node no longer holds it, every sandbox of it is placed on the other (never
// on a node that would answer image-not-found); a delete through the router is refused while
// a node's sandbox uses it (423 image-in-use), then removes it from every node.
func TestClusterImages(t *testing.T) {
	requireRoot(t)
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	nodes := map[string]*daemon{}
	for _, name := range []string{"img-a", "img-b"} {
		nodes[name] = startClusterNode(t, cp, admin, name, withToken(nodeToken),
			withArgs("--cluster-max-sandboxes", "20", "--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	rt := &daemon{t: t, URL: startRouter(t, cp, routerToken, nodeToken), Token: routerToken}
	holds := func(name, image string) bool {
		var n v1alpha1.BothyNode
		return admin.Get(ctx, client.ObjectKey{Name: name}, &n) == nil && slices.Contains(n.Status.Images, image)
	}
	on := func(id string) string {
		t.Helper()
		for name, d := range nodes {
			if r := d.doJSON("GET", "/v1/sandboxes/"+id, nil); r.Status == 200 {
				return name
			}
		}
		t.Fatalf("%s is on no node", id)
		return ""
	}

	ref := serveRegistry(t, busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}, User: "root"}, 0), "test/busybox:v1")
	decode[imageJSON](t, rt.doJSON("POST", "/v1/images", map[string]any{"ref": ref, "name": "bb"}), 202)
	rt.waitImage("bb")
	for name, d := range nodes {
		if im := decode[imageJSON](t, d.doJSON("GET", "/v1/images/bb", nil), 200); im.State != "ready" {
			t.Fatalf("bb on %s after the router read it ready: %s", name, im.State)
		}
	}
	waitCond(t, 30*time.Second, "both nodes listing bb", func() (bool, error) {
		return holds("img-a", "bb") && holds("img-b", "bb"), nil
	})
	spread := map[string]int{}
	for i := range 4 {
		id := fmt.Sprintf("bb-%d", i)
		decode[sandboxJSON](t, rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "image": "bb"}), 201)
		spread[on(id)]++
	}
	if len(spread) != 2 {
		t.Fatalf("sandboxes of an image both nodes hold all went to one: %v", spread)
	}
	for i := range 4 {
		if r := rt.doJSON("DELETE", fmt.Sprintf("/v1/sandboxes/bb-%d", i), nil); r.Status != 204 {
			t.Fatalf("delete bb-%d: %d %s", i, r.Status, r.Body)
		}
	}

	// img-b drops it: every later sandbox of it goes to img-a.
	if r := nodes["img-b"].doJSON("DELETE", "/v1/images/bb", nil); r.Status != 204 {
		t.Fatalf("delete bb on img-b: %d %s", r.Status, r.Body)
	}
	waitCond(t, 30*time.Second, "img-b no longer listing bb", func() (bool, error) { return !holds("img-b", "bb"), nil })
	for i := range 4 {
		id := fmt.Sprintf("only-%d", i)
		decode[sandboxJSON](t, rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "image": "bb", "start": true}), 201)
		if n := on(id); n != "img-a" {
			t.Fatalf("%s of bb went to %s, which does not hold it", id, n)
		}
	}

	wantProblem(t, rt.doJSON("DELETE", "/v1/images/bb", nil), 423, "image-in-use")
	for i := range 4 {
		if r := rt.doJSON("DELETE", fmt.Sprintf("/v1/sandboxes/only-%d?force=true", i), nil); r.Status != 204 {
			t.Fatalf("delete only-%d: %d %s", i, r.Status, r.Body)
		}
	}
	if r := rt.doJSON("DELETE", "/v1/images/bb", nil); r.Status != 204 {
		t.Fatalf("delete bb through the router: %d %s", r.Status, r.Body)
	}
	wantProblem(t, rt.doJSON("GET", "/v1/images/bb", nil), 404, "image-not-found")
	for name, d := range nodes {
		if r := d.doJSON("GET", "/v1/images/bb", nil); r.Status != 404 {
			t.Fatalf("bb still on %s: %d", name, r.Status)
		}
	}
}
