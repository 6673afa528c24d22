package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
)

// snapshotNode is a fake node's E2B snapshots: the sandboxes it holds and the snapshot
// templates (snap-<sandbox>-<name>) it holds, each with one generation.
type snapshotNode struct {
	mu        sync.Mutex
	sandboxes []string
	snapshots map[string]bool
	leased    map[string]bool // a delete of these is refused, as a node refuses a leased generation
	deletes   int
}

func (n *snapshotNode) serve(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.mu.Lock()
		defer n.mu.Unlock()
		bothy := r.Header.Get("Authorization") == "Bearer node-token"
		e2bKey := r.Header.Get("X-API-KEY") == "node-token"
		w.Header().Set("Content-Type", "application/json")
		switch p := r.URL.Path; {
		case bothy && r.Method == "GET" && strings.HasPrefix(p, "/v1/sandboxes/") && slices.Contains(n.sandboxes, strings.TrimPrefix(p, "/v1/sandboxes/")):
			_, _ = w.Write([]byte(`{}`))
		case bothy && r.Method == "GET" && strings.HasPrefix(p, "/v1/templates/") && n.snapshots[strings.TrimPrefix(p, "/v1/templates/")]:
			_ = json.NewEncoder(w).Encode(map[string]any{"name": strings.TrimPrefix(p, "/v1/templates/"), "latest": "g000007", "generations": 1})
		case e2bKey && r.Method == "POST" && strings.HasSuffix(p, "/snapshots"):
			id := strings.TrimSuffix(strings.TrimPrefix(p, "/sandboxes/"), "/snapshots")
			if !slices.Contains(n.sandboxes, id) {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			name := "snap-" + id + "-flow"
			n.snapshots[name] = true
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]any{"snapshotID": name, "names": []string{"flow"}})
		case e2bKey && r.Method == "GET" && p == "/snapshots":
			out := []map[string]any{}
			for s := range n.snapshots {
				if strings.HasPrefix(s, "snap-"+r.URL.Query().Get("sandboxID")) {
					out = append(out, map[string]any{"snapshotID": s, "names": []string{"flow"}})
				}
			}
			_ = json.NewEncoder(w).Encode(out)
		case e2bKey && r.Method == "DELETE" && strings.HasPrefix(p, "/templates/"):
			name := strings.TrimPrefix(p, "/templates/")
			n.deletes++
			switch {
			case n.leased[name]:
				w.WriteHeader(http.StatusLocked)
				_, _ = w.Write([]byte(`{"code":423,"message":"leased"}`))
			case n.snapshots[name]:
				delete(n.snapshots, name)
				w.WriteHeader(http.StatusNoContent)
			default:
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(`{"code":404,"message":"no such template"}`))
			}
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestE2BSnapshotsRouted: E2B's snapshots through the router. A snapshot's create goes to its
// sandbox's node, and placement then counts the snapshot's generation there before the
// node's BothyNode lists it; the list is every node's, merged by id; a delete goes to every
// node, a node without the snapshot not counting, a refusal winning.
func TestE2BSnapshotsRouted(t *testing.T) {
	t.Parallel()
	a := &snapshotNode{sandboxes: []string{"sb-a"}, snapshots: map[string]bool{"snap-sb-a-old": true, "tools": true}, leased: map[string]bool{}}
	b := &snapshotNode{sandboxes: []string{"sb-b"}, snapshots: map[string]bool{}, leased: map[string]bool{}}
	rt := routerOver(t, map[string]string{"node-a": a.serve(t), "node-b": b.serve(t)})
	call := func(method, path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(`{"name":"flow"}`))
		req.Header.Set("X-API-KEY", "e2b_client-token")
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		return w
	}
	ids := func(w *httptest.ResponseRecorder) []string {
		t.Helper()
		var page []struct{ SnapshotID string }
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &page) != nil {
			t.Fatalf("the snapshot list: %d %s", w.Code, w.Body)
		}
		var out []string
		for _, s := range page {
			out = append(out, s.SnapshotID)
		}
		return out
	}

	if w := call("POST", "/sandboxes/sb-b/snapshots"); w.Code != 201 || !strings.Contains(w.Body.String(), "snap-sb-b-flow") {
		t.Fatalf("the snapshot of sb-b: %d %s", w.Code, w.Body)
	}
	if !b.snapshots["snap-sb-b-flow"] || a.snapshots["snap-sb-b-flow"] {
		t.Fatalf("the snapshot is not on sb-b's node alone: a %v, b %v", a.snapshots, b.snapshots)
	}
	views, err := rt.nodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rt.withRecentCapture(views, "snap-sb-b-flow")
	if got := views["node-b"].obj.Status.Generations; len(got) != 1 || got[0].Template != "snap-sb-b-flow" || got[0].Generation != "g000007" || len(views["node-a"].obj.Status.Generations) != 0 {
		t.Fatalf("the nodes' generations for placement after the snapshot: b %v, a %v", got, views["node-a"].obj.Status.Generations)
	}

	if got, want := ids(call("GET", "/snapshots")), []string{"snap-sb-a-old", "snap-sb-b-flow"}; !slices.Equal(got, want) {
		t.Fatalf("the merged list %v, want %v", got, want)
	}
	if got, want := ids(call("GET", "/snapshots?sandboxID=sb-b")), []string{"snap-sb-b-flow"}; !slices.Equal(got, want) {
		t.Fatalf("the list of sb-b's snapshots %v, want %v (the query goes to the nodes)", got, want)
	}

	a.leased["snap-sb-a-old"] = true
	if w := call("DELETE", "/templates/snap-sb-a-old"); w.Code != 423 {
		t.Fatalf("a delete node-a refuses: %d %s, want its 423", w.Code, w.Body)
	}
	if w := call("DELETE", "/templates/snap-sb-b-flow"); w.Code != 204 {
		t.Fatalf("the delete of sb-b's snapshot: %d %s, want 204 (node-a's 404 does not count)", w.Code, w.Body)
	}
	if b.snapshots["snap-sb-b-flow"] || a.deletes != 2 || b.deletes != 2 {
		t.Fatalf("after the deletes: b holds %v; deletes a %d, b %d, want 2 each (every node asked)", b.snapshots, a.deletes, b.deletes)
	}
	if w := call("DELETE", "/templates/snap-sb-b-flow"); w.Code != 404 {
		t.Fatalf("a delete of a snapshot no node holds: %d %s, want 404", w.Code, w.Body)
	}
	if got, want := ids(call("GET", "/snapshots?sandboxID=sb-b")), []string(nil); !slices.Equal(got, want) {
		t.Fatalf("sb-b's snapshots after the delete %v, want none", got)
	}
}
