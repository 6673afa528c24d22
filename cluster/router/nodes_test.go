package router

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/openapi"
)

// call sends one request to rt with the client token and answers the status and body.
func call(t *testing.T, rt http.Handler, method, path, body string, header ...string) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	req.Header.Set("Authorization", "Bearer client-token")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	rt.ServeHTTP(w, req)
	return w.Code, w.Body.Bytes()
}

func codeOf(body []byte) string {
	var p struct{ Code string }
	_ = json.Unmarshal(body, &p)
	return p.Code
}

// TestNodesAPI: the router lists its BothyNodes with their leases judged by its clock, answers
// one by name, and writes cordon and drain to the node's spec, nothing else of it.
func TestNodesAPI(t *testing.T) {
	t.Parallel()
	rt := newRouter(t, "http://127.0.0.1:2")

	status, body := call(t, rt, "GET", "/v1/nodes", "")
	var list openapi.NodeList
	if status != 200 || json.Unmarshal(body, &list) != nil || len(list.Items) != 2 {
		t.Fatalf("list: %d %s", status, body)
	}
	down, up := list.Items[0], list.Items[1]
	if down.Name != "down" || up.Name != "up" {
		t.Fatalf("list not in name order: %s", body)
	}
	if !up.Live || down.Live || up.Health != "Healthy" || up.LeaseRenewedAt == nil || *up.LeaseDurationSeconds != 15 {
		t.Fatalf("leases or health misread: %s", body)
	}
	if time.Since(*down.LeaseRenewedAt) < 30*time.Second {
		t.Fatalf("down's lease renewal %v, want a minute ago", down.LeaseRenewedAt)
	}

	for _, tt := range []struct {
		name, method, path, body string
		wantStatus               int
		wantCode                 string
	}{
		{"one node", "GET", "/v1/nodes/up", "", 200, ""},
		{"no such node", "GET", "/v1/nodes/elsewhere", "", 404, "node-not-found"},
		{"no name of a node", "GET", "/v1/nodes/Not_A_Name", "", 400, "invalid-request"},
		{"below a node", "GET", "/v1/nodes/up/more", "", 404, "not-found"},
		{"delete a node", "DELETE", "/v1/nodes/up", "", 405, "method-not-allowed"},
		{"post to the list", "POST", "/v1/nodes", "{}", 405, "method-not-allowed"},
		{"patch no such node", "PATCH", "/v1/nodes/elsewhere", `{"cordoned":true}`, 404, "node-not-found"},
		{"patch a status field", "PATCH", "/v1/nodes/up", `{"health":"Healthy"}`, 400, "invalid-request"},
		{"patch no object", "PATCH", "/v1/nodes/up", `[true]`, 400, "invalid-request"},
		{"patch a null cordon", "PATCH", "/v1/nodes/up", `{"cordoned":null}`, 400, "invalid-request"},
		{"patch a bad deadline", "PATCH", "/v1/nodes/up", `{"drain_deadline":"tomorrow"}`, 400, "invalid-request"},
		{"patch too large", "PATCH", "/v1/nodes/up", `{"cordoned":true,"x":"` + strings.Repeat("a", maxNodePatchBytes) + `"}`, 413, "payload-too-large"},
	} {
		status, body := call(t, rt, tt.method, tt.path, tt.body)
		if status != tt.wantStatus || codeOf(body) != tt.wantCode {
			t.Errorf("%s: %d %s, want %d %q", tt.name, status, body, tt.wantStatus, tt.wantCode)
		}
	}

	spec := func() v1alpha1.BothyNodeSpec {
		var n v1alpha1.BothyNode
		if err := rt.cfg.Client.Get(t.Context(), client.ObjectKey{Name: "up"}, &n); err != nil {
			t.Fatal(err)
		}
		return n.Spec
	}
	patch := func(body string) openapi.Node {
		t.Helper()
		status, out := call(t, rt, "PATCH", "/v1/nodes/up", body, "Content-Type", "application/json")
		var n openapi.Node
		if status != 200 || json.Unmarshal(out, &n) != nil {
			t.Fatalf("PATCH %s: %d %s", body, status, out)
		}
		return n
	}
	if n := patch(`{"cordoned":true}`); !n.Cordoned || n.Draining || !spec().Cordoned {
		t.Fatalf("cordon: answered %+v, spec %+v", n, spec())
	}
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	n := patch(`{"draining":true,"drain_deadline":"2030-01-02T03:04:05Z"}`)
	if s := spec(); !n.Draining || !n.Cordoned || n.DrainDeadline == nil || !n.DrainDeadline.Equal(deadline) ||
		!s.Draining || !s.Cordoned || s.DrainDeadline == nil || !s.DrainDeadline.Time.Equal(deadline) {
		t.Fatalf("drain: answered %+v, spec %+v", n, s)
	}
	if n := patch(`{"drain_deadline":null,"draining":false,"cordoned":false}`); n.Cordoned || n.Draining || n.DrainDeadline != nil || spec() != (v1alpha1.BothyNodeSpec{}) {
		t.Fatalf("uncordon and call off the drain: answered %+v, spec %+v", n, spec())
	}
	// The status is the node's: a patch leaves it as it was.
	var obj v1alpha1.BothyNode
	if err := rt.cfg.Client.Get(t.Context(), client.ObjectKey{Name: "up"}, &obj); err != nil || obj.Status.Health != v1alpha1.NodeHealthy || obj.Status.Address == "" {
		t.Fatalf("the node's status after the patches: %+v %v", obj.Status, err)
	}
}

// TestNodesOperatorToken: with an operator's token, the clients' token reads the nodes but
// may not cordon or drain one (403, the node's spec unchanged); the operator's token may, and
// is taken for the rest of the API too.
func TestNodesOperatorToken(t *testing.T) {
	t.Parallel()
	rt := newRouter(t, "http://127.0.0.1:2")
	rt.cfg.OperatorToken = "operator-token"
	asOperator := []string{"Authorization", "Bearer operator-token", "Content-Type", "application/json"}

	if status, body := call(t, rt, "GET", "/v1/nodes/up", ""); status != 200 {
		t.Fatalf("a read with the clients' token: %d %s", status, body)
	}
	if status, body := call(t, rt, "PATCH", "/v1/nodes/up", `{"cordoned":true}`, "Content-Type", "application/json"); status != 403 || codeOf(body) != "forbidden" {
		t.Fatalf("a cordon with the clients' token: %d %s, want 403 forbidden", status, body)
	}
	var n v1alpha1.BothyNode
	if err := rt.cfg.Client.Get(t.Context(), client.ObjectKey{Name: "up"}, &n); err != nil || n.Spec.Cordoned {
		t.Fatalf("the refused cordon changed the node: %+v %v", n.Spec, err)
	}
	if status, body := call(t, rt, "PATCH", "/v1/nodes/up", `{"cordoned":true}`, asOperator...); status != 200 {
		t.Fatalf("a cordon with the operator's token: %d %s", status, body)
	}
	if err := rt.cfg.Client.Get(t.Context(), client.ObjectKey{Name: "up"}, &n); err != nil || !n.Spec.Cordoned {
		t.Fatalf("the operator's cordon: %+v %v", n.Spec, err)
	}
	if status, body := call(t, rt, "GET", "/v1/nodes", "", asOperator...); status != 200 {
		t.Fatalf("a read with the operator's token: %d %s", status, body)
	}
	if status, body := call(t, rt, "PATCH", "/v1/nodes/up", `{"cordoned":false}`, "Authorization", "Bearer wrong"); status != 401 {
		t.Fatalf("a cordon with no valid token: %d %s, want 401", status, body)
	}
}

// TestRouterInfoSaysCluster: /v1/info through the router is a live node's, with the
// cluster's nodes added, by which the dashboard knows to show its nodes page.
func TestRouterInfoSaysCluster(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"version":"v-node","limits":{"max_body_bytes":1}}`)
	}))
	t.Cleanup(up.Close)
	rt := newRouter(t, up.URL)
	status, body := call(t, rt, "GET", "/v1/info", "")
	var info struct {
		Version string
		Limits  map[string]int
		Cluster *struct {
			Nodes     int `json:"nodes"`
			LiveNodes int `json:"live_nodes"`
		}
	}
	if status != 200 || json.Unmarshal(body, &info) != nil || info.Version != "v-node" || info.Limits["max_body_bytes"] != 1 ||
		info.Cluster == nil || info.Cluster.Nodes != 2 || info.Cluster.LiveNodes != 1 {
		t.Fatalf("info through the router: %d %s", status, body)
	}
}

// TestRouterDashboard: the router serves the dashboard and the contract without a token, and
// keeps other origins' pages out of its API, as a node does.
func TestRouterDashboard(t *testing.T) {
	t.Parallel()
	// The node "up" says whether the router's Origin reached it: the node, at another
	// host, would refuse it as a foreign page's.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Origin") != "" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, "no origin")
	}))
	t.Cleanup(up.Close)
	rt := newRouter(t, up.URL)
	rt.cfg.Dashboard = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "the page") })
	for _, tt := range []struct {
		name, method, path, origin string
		wantStatus                 int
		wantBody                   string
	}{
		{"the page", "GET", "/", "", 200, "the page"},
		{"an asset", "GET", "/assets/app.js", "", 200, "the page"},
		{"the contract", "GET", "/openapi.yaml", "", 200, "openapi: "},
		{"a post to the page", "POST", "/", "", 405, "method-not-allowed"},
		{"the API from its own page", "GET", "/v1/nodes", "http://example.com", 200, `"items"`},
		{"the API from another origin", "GET", "/v1/nodes", "https://evil.example", 403, "forbidden"},
		{"a sandbox's call from its own page reaches the node without the Origin", "POST", "/v1/sandboxes/on-up/exec", "http://example.com", 200, "no origin"},
	} {
		req := httptest.NewRequest(tt.method, tt.path, nil) // Host: example.com
		if strings.HasPrefix(tt.path, "/v1/") {
			req.Header.Set("Authorization", "Bearer client-token")
		}
		if tt.origin != "" {
			req.Header.Set("Origin", tt.origin)
		}
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		if w.Code != tt.wantStatus || !strings.Contains(w.Body.String(), tt.wantBody) {
			t.Errorf("%s: %d %.200s, want %d with %q", tt.name, w.Code, w.Body, tt.wantStatus, tt.wantBody)
		}
	}
}
