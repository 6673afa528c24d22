package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// nodeJSON is the part of the contract's Node the cluster tests read.
type nodeJSON struct {
	Name     string `json:"name"`
	Live     bool   `json:"live"`
	Health   string `json:"health"`
	Cordoned bool   `json:"cordoned"`
	Address  string `json:"address"`
	Free     struct {
		Sandboxes int `json:"sandboxes"`
		MemoryMB  int `json:"memory_mb"`
	} `json:"free"`
	Capacity struct {
		Sandboxes int `json:"sandboxes"`
	} `json:"capacity"`
	LeaseRenewedAt *time.Time `json:"lease_renewed_at"`
}

// waitRouterLive waits until the router rt reads node name as live. A node that joins is
// published before the routers' caches hear of it, and until they do a router neither places
// on it nor gives it what it writes to every node (webhooks, secrets).
func waitRouterLive(t *testing.T, rt *daemon, name string) {
	t.Helper()
	waitCond(t, 30*time.Second, "the router to read "+name+" as live", func() (bool, error) {
		r := rt.doJSON("GET", "/v1/nodes/"+name, nil)
		if r.Status == http.StatusNotFound {
			return false, nil
		}
		var n nodeJSON
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &n) != nil {
			return false, fmt.Errorf("GET /v1/nodes/%s: %d %s", name, r.Status, r.Body)
		}
		return n.Live, nil
	})
}

// nodeDrainJSON is the contract's NodeDrain.
type nodeDrainJSON struct {
	Remaining int  `json:"remaining"`
	Drained   bool `json:"drained"`
}

// TestClusterNodesAPI: three real node bothyds and a real router, held to the generated RBAC.
// The router's GET /v1/nodes lists the three, live and healthy, with the capacity each
// publishes; a cordon through the router's PATCH (a write of the BothyNode's spec the
// router's role must allow) makes placement skip the node, so creates through the router land
// elsewhere, and an uncordon makes it a candidate again; a drain through the router reaches
// the node, which publishes itself drained; a node's own API answers the nodes API 501
// not-a-cluster.
func TestClusterNodesAPI(t *testing.T) {
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	names := []string{"node-a", "node-b", "node-c"}
	nodes := map[string]*daemon{}
	for _, name := range names {
		nodes[name] = startClusterNode(t, cp, admin, name, withToken(nodeToken), withArgs("--cluster-max-sandboxes", "10",
			"--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	url := startRouter(t, cp, routerToken, nodeToken)
	call := func(method, path string, body any) (int, []byte) {
		t.Helper()
		return routerCall(ctx, t, url, routerToken, method, path, body)
	}
	list := func() []nodeJSON {
		t.Helper()
		status, body := call("GET", "/v1/nodes", nil)
		var out struct{ Items []nodeJSON }
		if status != 200 || json.Unmarshal(body, &out) != nil {
			t.Fatalf("GET /v1/nodes: %d %s", status, body)
		}
		return out.Items
	}

	// The three nodes, in name order, live and healthy with their published capacity (the
	// router's cache may lag the nodes' first status by a moment).
	waitCond(t, 30*time.Second, "the router to list three live healthy nodes", func() (bool, error) {
		items := list()
		if len(items) != 3 {
			return false, nil
		}
		for i, n := range items {
			if n.Name != names[i] {
				return false, fmt.Errorf("the nodes out of name order: %+v", items)
			}
			if !n.Live || n.Health != "Healthy" || n.Capacity.Sandboxes != 10 || n.Address != nodes[n.Name].URL || n.LeaseRenewedAt == nil {
				return false, nil
			}
		}
		return true, nil
	})
	if status, body := call("GET", "/v1/nodes/node-z", nil); status != 404 || problemCode(body) != "node-not-found" {
		t.Fatalf("GET an unknown node: %d %s, want 404 node-not-found", status, body)
	}
	// A node itself is no cluster router.
	if r := nodes["node-a"].do("GET", "/v1/nodes", nil, nil); r.Status != 501 || problemCode(r.Body) != "not-a-cluster" {
		t.Fatalf("GET /v1/nodes of a node: %d %s, want 501 not-a-cluster", r.Status, r.Body)
	}

	setCordon := func(name string, on bool) {
		t.Helper()
		status, body := call("PATCH", "/v1/nodes/"+name, map[string]any{"cordoned": on})
		var n nodeJSON
		if status != 200 || json.Unmarshal(body, &n) != nil || n.Cordoned != on || n.Name != name {
			t.Fatalf("PATCH %s cordoned=%v through the router: %d %s", name, on, status, body)
		}
		// Placement reads the router's cache, which the list reads too: wait for it there.
		waitCond(t, 30*time.Second, fmt.Sprintf("the router to see %s cordoned=%v", name, on), func() (bool, error) {
			status, body := call("GET", "/v1/nodes/"+name, nil)
			if status != 200 || json.Unmarshal(body, &n) != nil {
				return false, fmt.Errorf("GET %s: %d %s", name, status, body)
			}
			return n.Cordoned == on, nil
		})
	}
	// where creates sandbox id through the router and names the node that holds it, by
	// asking each node directly.
	where := func(id string) string {
		t.Helper()
		if status, body := call("POST", "/v1/sandboxes", map[string]any{"id": id}); status != 201 {
			t.Fatalf("create %s through the router: %d %s", id, status, body)
		}
		holder := ""
		for name, d := range nodes {
			if r := d.do("GET", "/v1/sandboxes/"+id, nil, nil); r.Status == 200 {
				if holder != "" {
					t.Fatalf("%s is on %s and %s", id, holder, name)
				}
				holder = name
			}
		}
		return holder
	}

	// node-a and node-b cordoned: every create lands on node-c.
	setCordon("node-a", true)
	setCordon("node-b", true)
	for i := range 3 {
		if on := where(fmt.Sprintf("c-%d", i)); on != "node-c" {
			t.Fatalf("a create with node-a and node-b cordoned landed on %q, want node-c", on)
		}
	}
	// node-a uncordoned and node-c cordoned: node-a is placed on again.
	setCordon("node-a", false)
	setCordon("node-c", true)
	for i := range 3 {
		if on := where(fmt.Sprintf("a-%d", i)); on != "node-a" {
			t.Fatalf("a create after node-a's uncordon, with node-b and node-c cordoned, landed on %q, want node-a", on)
		}
	}
	// All cordoned: no node takes a create through the router.
	setCordon("node-a", true)
	if status, body := call("POST", "/v1/sandboxes", map[string]any{"id": "none"}); status != 503 || problemCode(body) != "no-node-available" {
		t.Fatalf("a create with every node cordoned: %d %s, want 503 no-node-available", status, body)
	}
	// The cordoned nodes serve their sandboxes as before.
	if status, body := call("GET", "/v1/sandboxes/c-0", nil); status != 200 {
		t.Fatalf("GET c-0 on cordoned node-c: %d %s", status, body)
	}
	for _, n := range list() {
		if !n.Cordoned {
			t.Fatalf("%s not cordoned in the list: %+v", n.Name, n)
		}
	}

	// A drain through the router: node-b, which holds nothing, reads it from its spec and
	// publishes itself drained; called off, its drain status goes.
	if status, body := call("PATCH", "/v1/nodes/node-b", map[string]any{"draining": true, "drain_deadline": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}); status != 200 {
		t.Fatalf("drain node-b through the router: %d %s", status, body)
	}
	drain := func() (*nodeDrainJSON, bool) {
		t.Helper()
		status, body := call("GET", "/v1/nodes/node-b", nil)
		var n struct {
			Draining      bool           `json:"draining"`
			DrainDeadline *time.Time     `json:"drain_deadline"`
			Drain         *nodeDrainJSON `json:"drain"`
		}
		if status != 200 || json.Unmarshal(body, &n) != nil {
			t.Fatalf("GET node-b: %d %s", status, body)
		}
		return n.Drain, n.Draining && n.DrainDeadline != nil
	}
	waitCond(t, 30*time.Second, "node-b to publish itself drained", func() (bool, error) {
		d, draining := drain()
		return draining && d != nil && d.Drained && d.Remaining == 0, nil
	})
	if status, body := call("PATCH", "/v1/nodes/node-b", map[string]any{"draining": false, "drain_deadline": nil}); status != 200 {
		t.Fatalf("call off node-b's drain through the router: %d %s", status, body)
	}
	waitCond(t, 30*time.Second, "node-b's drain status gone", func() (bool, error) {
		d, draining := drain()
		return !draining && d == nil, nil
	})
}

// TestClusterDashboardNodes: the router serves the dashboard under the same policy as a node;
// in headless Chromium, with the router's token entered in its form, the page offers the
// Nodes page (the router's /v1/info says cluster), lists both real nodes live and healthy,
// and its Cordon and Uncordon buttons, each confirmed, write the BothyNode's spec, checked
// through the API server. A node's own dashboard offers no Nodes page.
func TestClusterDashboardNodes(t *testing.T) {
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	nodeA := startClusterNode(t, cp, admin, "node-a", withToken(nodeToken))
	startClusterNode(t, cp, admin, "node-b", withToken(nodeToken))
	url := startRouter(t, cp, routerToken, nodeToken)

	resp, err := http.Get(url + "/") //nolint:noctx // a test's one call
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); resp.StatusCode != 200 || csp != dashboardCSP {
		t.Fatalf("GET / of the router: %d, Content-Security-Policy %q, want %q", resp.StatusCode, csp, dashboardCSP)
	}

	bctx, errs, _ := consoleBrowser(t)
	run(bctx, t, "opening the router's dashboard", chromedp.Navigate(url+"/"))
	until(bctx, t, "the token form", `!document.querySelector("#token-panel").hidden`)
	run(bctx, t, "entering the router's token",
		chromedp.SendKeys(chromedp.CSS("#token-input"), routerToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)))
	until(bctx, t, "live events through the router", `document.querySelector("#live").textContent === "live"`)
	until(bctx, t, "the Nodes page offered", `!document.querySelector("#nav-nodes").hidden`)
	goTo(bctx, t, "#/nodes", "nodes")
	for _, name := range []string{"node-a", "node-b"} {
		until(bctx, t, name+" listed live and healthy", `(() => { const r = document.querySelector('#nodes tr[data-node="`+name+`"]');
			return r && r.dataset.live === "true" && r.querySelector("td.health").dataset.health === "Healthy" && r.dataset.cordoned === "false" })()`)
	}
	saveScreenshot(bctx, t, "nodes")

	cordoned := func(name string, want bool) {
		t.Helper()
		waitCond(t, 30*time.Second, fmt.Sprintf("%s's spec cordoned=%v in the API server", name, want), func() (bool, error) {
			var n v1alpha1.BothyNode
			if err := admin.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
				return false, err
			}
			return n.Spec.Cordoned == want, nil
		})
	}
	confirmClick(bctx, t, "cordoning node-a", `#nodes tr[data-node="node-a"] button[data-action="cordon-node"]`)
	until(bctx, t, "node-a shown cordoned", `document.querySelector('#nodes tr[data-node="node-a"]')?.dataset.cordoned === "true"`)
	cordoned("node-a", true)
	cordoned("node-b", false)
	saveScreenshot(bctx, t, "nodes-cordoned")
	confirmClick(bctx, t, "uncordoning node-a", `#nodes tr[data-node="node-a"] button[data-action="uncordon-node"]`)
	until(bctx, t, "node-a shown schedulable", `document.querySelector('#nodes tr[data-node="node-a"]')?.dataset.cordoned === "false"`)
	cordoned("node-a", false)

	// A call on a sandbox from the router's page reaches its node (which must not take the
	// router's page for a foreign one): a delete from the sandboxes' list.
	if status, body := routerCall(ctx, t, url, routerToken, "POST", "/v1/sandboxes", map[string]any{"id": "dash-s"}); status != 201 {
		t.Fatalf("create dash-s through the router: %d %s", status, body)
	}
	goTo(bctx, t, "#/", "sandboxes")
	confirmClick(bctx, t, "deleting dash-s from the router's page", `tr[data-id="dash-s"] button[data-action="delete"]`)
	until(bctx, t, "dash-s gone from the list", `document.querySelector('tr[data-id="dash-s"]') === null`)
	if status, body := routerCall(ctx, t, url, routerToken, "GET", "/v1/sandboxes/dash-s", nil); status != 404 {
		t.Fatalf("dash-s after its delete from the page: %d %s, want 404", status, body)
	}

	// A node's own dashboard: no cluster in its info, so no Nodes page.
	run(bctx, t, "opening node-a's own dashboard", chromedp.Navigate(nodeA.LoginURL()))
	until(bctx, t, "live events on node-a", `document.querySelector("#live").textContent === "live"`)
	until(bctx, t, "node-a's info read, and no Nodes page", `document.querySelector('[data-hint="vcpus"]').textContent.startsWith("default ") && document.querySelector("#nav-nodes").hidden`)
	errs.check(t)
}

// routerCall sends one API call to a router with its token.
func routerCall(ctx context.Context, t *testing.T, url, token, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(ctx, method, url+path, r)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
