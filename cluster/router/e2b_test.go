package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/e2b"
)

// TestE2BRouting: E2B's control plane takes the router's key and reaches the node with the
// node's; the envd plane takes the sandbox's access token (the node's), checked by the router
// before any node is asked, and reaches the node with it unchanged.
func TestE2BRouting(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get(e2b.SandboxHeader) != "" && r.Header.Get("X-Access-Token") == e2b.AccessToken("node-token", "on-up") && r.Header.Get("Authorization") == "Basic dXNlcjo=":
			w.WriteHeader(http.StatusAccepted) // envd, with the sandbox's token and envd's user
		case r.Header.Get(e2b.SandboxHeader) == "" && r.Header.Get("X-API-KEY") == "node-token" && r.Header.Get("Authorization") == "":
			w.WriteHeader(http.StatusTeapot) // the control plane, with the node's key
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	t.Cleanup(up.Close)
	rt := newRouter(t, up.URL)
	upToken := e2b.AccessToken("node-token", "on-up")
	tests := []struct {
		name, method, path string
		header             map[string]string
		wantStatus         int
	}{
		{"control plane without a key", "GET", "/sandboxes/on-up", nil, 401},
		{"control plane with the node's key", "GET", "/sandboxes/on-up", map[string]string{"X-API-KEY": "e2b_node-token"}, 401},
		{"control plane to the node", "POST", "/sandboxes/on-up/timeout", map[string]string{"X-API-KEY": "e2b_client-token"}, 418},
		{"v2 detail to the node", "GET", "/v2/sandboxes/on-up", map[string]string{"X-API-KEY": "client-token"}, 418},
		{"a lost node", "GET", "/sandboxes/on-down", map[string]string{"X-API-KEY": "e2b_client-token"}, 503},
		{"on no node: a live node answers, as one node would", "DELETE", "/sandboxes/nowhere", map[string]string{"X-API-KEY": "e2b_client-token"}, 418},
		{"secrets go to the nodes with the node's key", "GET", "/secrets", map[string]string{"X-API-KEY": "e2b_client-token"}, 418},
		{"a volume token is checked first", "GET", "/volumecontent/v/path", map[string]string{"Authorization": "Bearer wrong"}, 401},
		{"envd without the access token", "POST", "/process.Process/List", map[string]string{e2b.SandboxHeader: "on-up"}, 401},
		{"envd with another sandbox's token", "POST", "/process.Process/List", map[string]string{e2b.SandboxHeader: "on-up", "X-Access-Token": e2b.AccessToken("node-token", "other")}, 401},
		{"envd health without a token says nothing", "GET", "/health", map[string]string{e2b.SandboxHeader: "nowhere"}, 204},
		{"envd to the node", "POST", "/process.Process/List", map[string]string{e2b.SandboxHeader: "on-up", "X-Access-Token": upToken, "Authorization": "Basic dXNlcjo="}, 202},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(tt.method, tt.path, nil)
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			rt.ServeHTTP(w, req)
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.wantStatus, w.Body)
			}
			if w.Code >= 400 && w.Code != http.StatusTeapot {
				// The router's own errors are in E2B's shape, which the SDKs read.
				var e struct {
					Code    int
					Message string
				}
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code != w.Code || e.Message == "" {
					t.Fatalf("error body %s, want E2B's {code, message}", w.Body)
				}
			}
		})
	}
}

// TestE2BCreatePlacement: an E2B create is placed as bothy's create is. A templateID that
// nodes list among their images goes only to a node holding that image, even when another
// node has more room (a node without the image would refuse it), and is refused 503 when no
// holder has room rather than sent elsewhere; a templateID that names a template goes to
// the holder of its generation; a name no node lists goes to the roomiest node. Without the
// image rule the router placed the image's name as a template, and the create went to the
// roomier node, which does not hold the image.
func TestE2BCreatePlacement(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	created := map[string]string{} // templateID to the node that got its create
	serve := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var b struct{ TemplateID string }
			if r.Method != "POST" || r.URL.Path != "/sandboxes" || json.NewDecoder(r.Body).Decode(&b) != nil {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			mu.Lock()
			created[b.TemplateID] = name
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]string{"sandboxID": name + "-" + b.TemplateID, "templateID": b.TemplateID})
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	// A small node is half used; a big one is empty: placement alone prefers the big one.
	small, smallFree := v1alpha1.Capacity{MemoryMB: 4096, MilliCPU: 4000, Sandboxes: 10}, v1alpha1.Capacity{MemoryMB: 2048, MilliCPU: 2000, Sandboxes: 5}
	big := v1alpha1.Capacity{MemoryMB: 65536, MilliCPU: 64000, Sandboxes: 100}
	bigFree := big
	full := v1alpha1.Capacity{MemoryMB: 0, MilliCPU: 0, Sandboxes: 0}
	rt := routerOverStatus(t, map[string]v1alpha1.BothyNodeStatus{
		// node-a holds the image py and has little room; node-b much room and no image.
		"node-a": {Address: serve("node-a"), Health: v1alpha1.NodeHealthy, Capacity: small, Free: smallFree,
			Images: []string{"py"}},
		"node-b": {Address: serve("node-b"), Health: v1alpha1.NodeHealthy, Capacity: big, Free: bigFree},
		// node-c holds the template tmpl's generation, and is small too.
		"node-c": {Address: serve("node-c"), Health: v1alpha1.NodeHealthy, Capacity: small, Free: smallFree,
			Generations: []v1alpha1.Generation{{Template: "tmpl", Generation: "g1"}}},
		// node-d holds the image rb but has no room left.
		"node-d": {Address: serve("node-d"), Health: v1alpha1.NodeHealthy, Capacity: small, Free: full,
			Images: []string{"rb"}},
	})
	tests := []struct {
		name, templateID string
		wantStatus       int
		wantNode         string
	}{
		{"an image goes to its holder, not to the roomier node", "py", 201, "node-a"},
		{"a template goes to its generation's holder", "tmpl", 201, "node-c"},
		{"a name no node lists goes to the roomiest node", "elsewhere", 201, "node-b"},
		{"an image whose holders are full is refused, not sent elsewhere", "rb", 503, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := call(t, rt, "POST", "/sandboxes", `{"templateID":"`+tt.templateID+`"}`, "X-API-KEY", "e2b_client-token", "Authorization", "", "Content-Type", "application/json")
			if status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", status, tt.wantStatus, body)
			}
			mu.Lock()
			got := created[tt.templateID]
			mu.Unlock()
			if got != tt.wantNode {
				t.Fatalf("the create reached %q, want %q", got, tt.wantNode)
			}
			if status == 503 && !strings.Contains(string(body), `the image \"rb\"`) {
				t.Fatalf("the refusal %s does not name the image", body)
			}
		})
	}
}
