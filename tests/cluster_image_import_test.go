package tests

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// TestClusterImageImport: an image import through a real router in front of two real nodes
// (docs/cluster.md, "Images and templates"). The archive is streamed to one node, the one
// placement chooses (imp-b: imp-a has a sandbox and fewer slots left); sandboxes of the image
// created through the router at once run there and use it; the router's read answers it; a
// second import of the name goes to the node that holds it (a replacement, as on one node);
// once both nodes hold the name an import through the router is refused with 409
// already-provisioned, and neither node's image is touched. Without the routing the import
// answered 501.
func TestClusterImageImport(t *testing.T) {
	requireRoot(t)
	cp, admin, _ := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	nodes := map[string]*daemon{}
	for name, slots := range map[string]string{"imp-a": "4", "imp-b": "20"} {
		nodes[name] = startClusterNode(t, cp, admin, name, withToken(nodeToken),
			withArgs("--cluster-max-sandboxes", slots, "--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	rt := &daemon{t: t, URL: startRouter(t, cp, routerToken, nodeToken), Token: routerToken}
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	holds := func(image string) []string {
		t.Helper()
		var out []string
		for _, name := range []string{"imp-a", "imp-b"} {
			switch r := nodes[name].doJSON("GET", "/v1/images/"+image, nil); r.Status {
			case 200:
				out = append(out, name)
			case 404:
			default:
				t.Fatalf("%s on %s: %d %s", image, name, r.Status, r.Body)
			}
		}
		return out
	}

	nodes["imp-a"].create("busy", false)
	waitObject(t, admin, "imp-a counting its sandbox", client.ObjectKey{Name: "imp-a"}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if n.Status.Allocated.Sandboxes != 1 {
			return fmt.Errorf("allocated %+v", n.Status.Allocated)
		}
		return nil
	})

	archive := dockerSave(t, busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}, User: "root"}, 0))
	im := decode[imageJSON](t, rt.do("PUT", "/v1/images/tool", bytes.NewReader(archive), octet), 201)
	if im.Name != "tool" || im.State != "ready" {
		t.Fatalf("the import through the router answered %+v", im)
	}
	if got := holds("tool"); len(got) != 1 || got[0] != "imp-b" {
		t.Fatalf("tool is on %v after the import through the router, want imp-b alone (the most room)", got)
	}
	for i := range 2 {
		id := fmt.Sprintf("tool-%d", i)
		decode[sandboxJSON](t, rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "image": "tool", "start": true}), 201)
		t.Cleanup(func() { rt.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil) })
		if r := nodes["imp-b"].doJSON("GET", "/v1/sandboxes/"+id, nil); r.Status != 200 {
			t.Fatalf("%s of the imported image is not on imp-b: %d %s", id, r.Status, r.Body)
		}
		if got := decode[execJSON](t, rt.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"busybox", "echo", "from tool"}}), 200); got.ExitCode != 0 || got.Stdout != "from tool\n" {
			t.Fatalf("exec in %s: %+v", id, got)
		}
	}
	if im := decode[imageJSON](t, rt.doJSON("GET", "/v1/images/tool", nil), 200); im.State != "ready" {
		t.Fatalf("the router's read of tool: %+v", im)
	}
	for i := range 2 {
		if r := rt.doJSON("DELETE", fmt.Sprintf("/v1/sandboxes/tool-%d?force=true", i), nil); r.Status != 204 {
			t.Fatalf("delete tool-%d: %d %s", i, r.Status, r.Body)
		}
	}

	// Again: to its holder, though placement would now choose imp-b anyway, so make imp-a the
	// holder of another name first.
	decode[imageJSON](t, nodes["imp-a"].do("PUT", "/v1/images/other", bytes.NewReader(archive), octet), 201)
	decode[imageJSON](t, rt.do("PUT", "/v1/images/other", bytes.NewReader(archive), octet), 201)
	if got := holds("other"); len(got) != 1 || got[0] != "imp-a" {
		t.Fatalf("other is on %v after its second import through the router, want imp-a alone (its holder)", got)
	}

	// Both hold tool: the router refuses to make it two images.
	decode[imageJSON](t, nodes["imp-a"].do("PUT", "/v1/images/tool", bytes.NewReader(archive), octet), 201)
	wantProblem(t, rt.do("PUT", "/v1/images/tool", bytes.NewReader(archive), octet), 409, "already-provisioned")
	if r := rt.doJSON("DELETE", "/v1/images/tool", nil); r.Status != 204 {
		t.Fatalf("delete tool through the router: %d %s", r.Status, r.Body)
	}
	if got := holds("tool"); len(got) != 0 {
		t.Fatalf("tool still on %v after the router's delete", got)
	}
	decode[imageJSON](t, rt.do("PUT", "/v1/images/tool", bytes.NewReader(archive), octet), 201)
	if got := holds("tool"); len(got) != 1 {
		t.Fatalf("tool on %v after the import that followed the delete, want one node", got)
	}
}

// BenchmarkClusterImageImport imports a 64 MiB image (a docker save archive of
// incompressible bytes) into one node, straight and through a router, under a new name each
// iteration, deleting it afterwards: what streaming through the router costs. A figure, not
// asserted.
func BenchmarkClusterImageImport(b *testing.B) {
	cp, admin, _ := startInstalledCluster(b, 10*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	d := startClusterNode(b, cp, admin, "bench-imp", withToken(nodeToken))
	rt := &daemon{t: d.t, URL: startRouter(b, cp, routerToken, nodeToken), Token: routerToken}
	archive := dockerSave(b, busyboxImage(b, v1.Config{Env: []string{"PATH=/bin"}}, 64<<20))
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	for _, via := range []struct {
		name string
		to   *daemon
	}{{"direct", d}, {"router", rt}} {
		b.Run(via.name, func(b *testing.B) {
			b.SetBytes(int64(len(archive)))
			for i := 0; b.Loop(); i++ {
				name := fmt.Sprintf("big-%s-%d", via.name, i)
				if r := via.to.do("PUT", "/v1/images/"+name, bytes.NewReader(archive), octet); r.Status != 201 {
					b.Fatalf("import through %s: %d %s", via.name, r.Status, r.Body)
				}
				b.StopTimer()
				if r := d.doJSON("DELETE", "/v1/images/"+name, nil); r.Status != 204 {
					b.Fatalf("delete %s: %d %s", name, r.Status, r.Body)
				}
				b.StartTimer()
			}
		})
	}
}
