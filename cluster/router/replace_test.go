package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/e2b"
)

// fakeNode answers every create with status and code (a problem), or 201 when code is "".
type fakeNode struct {
	name    string
	status  int
	code    string
	creates atomic.Int32
	srv     *httptest.Server
}

func newFakeNode(t *testing.T, name string, status int, code string) *fakeNode {
	n := &fakeNode{name: name, status: status, code: code}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.creates.Add(1)
		w.Header().Set("X-Node", name)
		if r.URL.Path == "/sandboxes" { // E2B's create: its error body, the code in a header
			if n.code == "" {
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"sandboxID":"x"}`))
				return
			}
			if n.code == "node-full" || n.code == "node-draining" {
				w.Header().Set(e2b.CodeHeader, n.code)
			}
			w.WriteHeader(n.status)
			_ = json.NewEncoder(w).Encode(map[string]any{"code": n.status, "message": "from " + name})
			return
		}
		if n.code == "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"x"}`))
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(n.status)
		_ = json.NewEncoder(w).Encode(map[string]any{"status": n.status, "code": n.code, "detail": "from " + name})
	}))
	t.Cleanup(n.srv.Close)
	return n
}

// replaceRouter is a router over live nodes, the first of them with the most room (placement
// tries it first).
func replaceRouter(t *testing.T, nodes ...*fakeNode) *Router {
	t.Helper()
	scheme := testScheme(t)
	b := fake.NewClientBuilder().WithScheme(scheme)
	for i, n := range nodes {
		room := v1alpha1.Capacity{MemoryMB: int64(100000 - 1000*i), MilliCPU: 1 << 30, Sandboxes: int32(1000 - 10*i)}
		b.WithObjects(testLease(n.name, time.Now(), 15),
			&v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Status: v1alpha1.BothyNodeStatus{
				Address: n.srv.URL, Health: v1alpha1.NodeHealthy, Capacity: room, Free: room}})
	}
	rt, err := New(Config{Client: b.Build(), Namespace: ns, DefaultMemoryMB: 512, DefaultVCPUs: 1, Token: "client-token", NodeToken: "node-token"})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func postCreate(rt *Router) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{"id":"x","start":true}`))
	req.Header.Set("Authorization", "Bearer client-token")
	w := httptest.NewRecorder()
	rt.ServeHTTP(w, req)
	return w
}

// TestCreateRefusedForRoomIsPlacedAgain: a node's node-full or node-draining (it made nothing)
// sends the create to the next node, and the client sees that node's answer alone; any other
// refusal is passed on as the node gave it; with every node refusing, no-node-available.
func TestCreateRefusedForRoomIsPlacedAgain(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"node-full", "node-draining"} {
		full, roomy := newFakeNode(t, "a-first", 503, code), newFakeNode(t, "b-second", 0, "")
		w := postCreate(replaceRouter(t, full, roomy))
		if w.Code != 201 || w.Header().Get("X-Node") != "b-second" || w.Header().Get("Retry-After") != "" {
			t.Fatalf("%s then room: %d %v %s, want b-second's 201 alone", code, w.Code, w.Header(), w.Body)
		}
		if full.creates.Load() != 1 || roomy.creates.Load() != 1 {
			t.Fatalf("%s then room: the nodes saw %d and %d creates, want 1 each", code, full.creates.Load(), roomy.creates.Load())
		}
	}

	other := newFakeNode(t, "a-first", 503, "storage-unavailable")
	spare := newFakeNode(t, "b-second", 0, "")
	w := postCreate(replaceRouter(t, other, spare))
	if w.Code != 503 || w.Header().Get("X-Node") != "a-first" || !strings.Contains(w.Body.String(), "storage-unavailable") || spare.creates.Load() != 0 {
		t.Fatalf("another 503: %d %v %s (the second node saw %d), want a-first's answer passed on", w.Code, w.Header(), w.Body, spare.creates.Load())
	}

	w = postCreate(replaceRouter(t, newFakeNode(t, "a-first", 503, "node-full"), newFakeNode(t, "b-second", 503, "node-draining")))
	if w.Code != 503 || !strings.Contains(w.Body.String(), CodeNoNode) || w.Header().Get("X-Node") != "" {
		t.Fatalf("every node refusing: %d %v %s, want the router's no-node-available", w.Code, w.Header(), w.Body)
	}
}

// TestCreateOfAHeldIDGoesToItsNode: a create naming an id the cluster holds (its object names
// a node) goes to that node, which answers it, even where placement would choose another; on
// a lost node it answers node-lost. A retry through another router cannot make the id twice.
func TestCreateOfAHeldIDGoesToItsNode(t *testing.T) {
	t.Parallel()
	up := newFakeNode(t, "up", 409, "already-provisioned")
	rt := newRouter(t, up.srv.URL)
	req := httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{"id":"on-up"}`))
	req.Header.Set("Authorization", "Bearer client-token")
	w := httptest.NewRecorder()
	rt.ServeHTTP(w, req)
	if w.Code != 409 || w.Header().Get("X-Node") != "up" || up.creates.Load() != 1 {
		t.Fatalf("a create of on-up: %d %v %s, want up's 409", w.Code, w.Header(), w.Body)
	}
	req = httptest.NewRequest("POST", "/v1/sandboxes", strings.NewReader(`{"id":"on-down"}`))
	req.Header.Set("Authorization", "Bearer client-token")
	w = httptest.NewRecorder()
	rt.ServeHTTP(w, req)
	if w.Code != 503 || !strings.Contains(w.Body.String(), CodeNodeLost) {
		t.Fatalf("a create of on-down: %d %s, want 503 node-lost", w.Code, w.Body)
	}
}

// TestE2BCreateRefusedForRoomIsPlacedAgain: E2B's create, refused node-full or node-draining
// (the code in a header, as E2B's body has no field for it), goes to the next node; another
// 503 is passed on.
func TestE2BCreateRefusedForRoomIsPlacedAgain(t *testing.T) {
	t.Parallel()
	post := func(rt *Router) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/sandboxes", strings.NewReader(`{"templateID":"base"}`))
		req.Header.Set("X-API-KEY", "e2b_client-token")
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		return w
	}
	for _, code := range []string{"node-full", "node-draining"} {
		full, roomy := newFakeNode(t, "a-first", 503, code), newFakeNode(t, "b-second", 0, "")
		w := post(replaceRouter(t, full, roomy))
		if w.Code != 201 || w.Header().Get("X-Node") != "b-second" || full.creates.Load() != 1 || roomy.creates.Load() != 1 {
			t.Fatalf("%s then room: %d %v %s (creates %d, %d), want b-second's 201", code, w.Code, w.Header(), w.Body, full.creates.Load(), roomy.creates.Load())
		}
	}
	other, spare := newFakeNode(t, "a-first", 503, "storage-unavailable"), newFakeNode(t, "b-second", 0, "")
	if w := post(replaceRouter(t, other, spare)); w.Code != 503 || w.Header().Get("X-Node") != "a-first" || spare.creates.Load() != 0 {
		t.Fatalf("another 503: %d %v %s, want a-first's answer passed on", w.Code, w.Header(), w.Body)
	}
}
