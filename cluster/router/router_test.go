package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
)

const ns = "bothy-system"

// newRouter is a router over a fake API server holding a node "up" (lease renewed now) and a
// node "down" (lease renewed a minute ago), each with one sandbox, and "up" answering at
// upURL.
func newRouter(t *testing.T, upURL string) *Router {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	lease := func(name string, renewed time.Time) *coordinationv1.Lease {
		d := int32(15)
		id := name
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node.LeaseName(name)},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &d, RenewTime: &metav1.MicroTime{Time: renewed}},
		}
	}
	bn := func(name, addr string) *v1alpha1.BothyNode {
		return &v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.BothyNodeStatus{Address: addr, Health: v1alpha1.NodeHealthy}}
	}
	sb := func(id, on string) *v1alpha1.Sandbox {
		return &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}, Status: v1alpha1.SandboxStatus{Node: on, State: v1alpha1.StateRunning}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		lease("up", time.Now()), lease("down", time.Now().Add(-time.Minute)),
		bn("up", upURL), bn("down", "http://127.0.0.1:1"),
		sb("on-up", "up"), sb("on-down", "down"),
	).Build()
	rt, err := New(Config{Client: c, Namespace: ns, Token: "client-token", NodeToken: "node-token"})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func TestRouting(t *testing.T) {
	t.Parallel()
	// The node "up": it must see the node token, never the client's.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer node-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Node", "up")
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(up.Close) // not defer: the parallel subtests run after this function returns
	rt := newRouter(t, up.URL)
	tests := []struct {
		name, method, path, token string
		wantStatus                int
		wantCode                  string // the problem's code, or "" for the node's own answer
	}{
		{"no token", "GET", "/v1/sandboxes/on-up", "", 401, "unauthorized"},
		{"a wrong token", "GET", "/v1/sandboxes/on-up", "node-token", 401, "unauthorized"},
		{"proxied to its node with the node token", "GET", "/v1/sandboxes/on-up/logs", "client-token", 418, ""},
		{"a lost node", "GET", "/v1/sandboxes/on-down", "client-token", 503, CodeNodeLost},
		{"on no node", "GET", "/v1/sandboxes/nowhere", "client-token", 404, "sandbox-not-found"},
		{"not routed yet", "GET", "/v1/templates", "client-token", 501, "not-implemented"},
		{"health without a token", "GET", "/healthz", "", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(tt.method, tt.path, nil)
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			w := httptest.NewRecorder()
			rt.ServeHTTP(w, req)
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.wantStatus, w.Body)
			}
			if tt.wantCode == "" {
				return
			}
			var p struct{ Code string }
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Code != tt.wantCode {
				t.Fatalf("problem %s, want code %s", w.Body, tt.wantCode)
			}
		})
	}
}

func TestNodeAddress(t *testing.T) {
	t.Parallel()
	for addr, ok := range map[string]bool{
		"http://10.0.0.1:7780":         true,
		"https://node-a.example:7780/": true,
		"file:///etc/passwd":           false,
		"http://user:pw@10.0.0.1":      false,
		"http://10.0.0.1/elsewhere":    false,
		"http://10.0.0.1/?x=1":         false,
		"10.0.0.1:7780":                false,
		"":                             false,
	} {
		n := &nodeView{obj: v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: v1alpha1.BothyNodeStatus{Address: addr}}}
		if _, err := nodeAddress(n); (err == nil) != ok {
			t.Errorf("nodeAddress(%q): %v, want ok=%v", addr, err, ok)
		}
	}
}
