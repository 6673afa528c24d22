package router

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// hookNode is a fake node's webhooks: id to the create's body; delivered is what each
// webhook's delivery state counts on this node.
type hookNode struct {
	mu           sync.Mutex
	hooks        map[string]map[string]any
	delivered    int
	refuse       bool // the create is refused, 429 limit-reached
	failDelete   bool // a delete answers 500
	idempotency  []string
	createBodies []string
}

func (n *hookNode) serve(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.mu.Lock()
		defer n.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer node-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		id := strings.TrimPrefix(r.URL.Path, "/v1/webhooks/")
		view := func(h map[string]any) map[string]any {
			at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
			return map[string]any{"id": h["id"], "url": h["url"], "events": h["events"], "created_at": "2026-12-07T10:00:00Z",
				"delivery": map[string]any{"pending": 1, "delivered": n.delivered, "failed": 0, "dropped": 0, "last_attempt_at": at.Add(time.Duration(n.delivered) * time.Second), "last_status": 200 + n.delivered}}
		}
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/webhooks":
			n.idempotency = append(n.idempotency, r.Header.Get("Idempotency-Key"))
			var h map[string]any
			var b bytes.Buffer
			_, _ = b.ReadFrom(r.Body)
			n.createBodies = append(n.createBodies, b.String())
			if json.Unmarshal(b.Bytes(), &h) != nil {
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(`{"code":"invalid-request"}`))
				return
			}
			if n.refuse {
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = w.Write([]byte(`{"code":"limit-reached"}`))
				return
			}
			hid, _ := h["id"].(string)
			if had, ok := n.hooks[hid]; ok && (had["url"] != h["url"] || had["secret"] != h["secret"]) {
				w.WriteHeader(http.StatusConflict)
				_, _ = w.Write([]byte(`{"code":"webhook-exists"}`))
				return
			}
			n.hooks[hid] = h
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(view(h))
		case r.Method == "GET" && r.URL.Path == "/v1/webhooks":
			items := []any{}
			for _, h := range n.hooks {
				items = append(items, view(h))
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
		case r.Method == "GET" && n.hooks[id] != nil:
			_ = json.NewEncoder(w).Encode(view(n.hooks[id]))
		case r.Method == "DELETE" && n.failDelete:
			w.WriteHeader(http.StatusInternalServerError)
		case r.Method == "DELETE" && n.hooks[id] != nil:
			delete(n.hooks, id)
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"code":"webhook-not-found"}`))
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (n *hookNode) ids() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for id := range n.hooks {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// TestWebhooksOnEveryNode: a webhook made through the router is made on every node under one
// id, which the router gives (from the Idempotency-Key, so a retry makes no second one); a
// create one node refuses is undone on the others and answers the refusal; when the undo
// fails too, the answer names where it is left; reads merge the nodes' delivery state;
// a delete reaches every node. No secret reaches the router's log.
func TestWebhooksOnEveryNode(t *testing.T) {
	t.Parallel()
	const secret = "a-very-secret-signing-key-0123456789"
	a, b, c := &hookNode{hooks: map[string]map[string]any{}, delivered: 1}, &hookNode{hooks: map[string]map[string]any{}, delivered: 2}, &hookNode{hooks: map[string]map[string]any{}, delivered: 4}
	rt := routerOver(t, map[string]string{"node-a": a.serve(t), "node-b": b.serve(t), "node-c": c.serve(t)})
	var logs bytes.Buffer
	var logMu sync.Mutex
	rt.log = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	call := func(method, path, body string, header ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer client-token")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		return w
	}
	code := func(w *httptest.ResponseRecorder) string {
		var p struct{ Code, Detail string }
		_ = json.Unmarshal(w.Body.Bytes(), &p)
		return p.Code
	}
	create := `{"url":"https://hooks.example.com/x","events":["sandbox.created"],"secret":"` + secret + `"}`

	w := call("POST", "/v1/webhooks", create, "Idempotency-Key", "key-1")
	var made struct{ ID string }
	if w.Code != 201 || json.Unmarshal(w.Body.Bytes(), &made) != nil || !strings.HasPrefix(made.ID, "wh-") || len(made.ID) != 19 {
		t.Fatalf("the create: %d %s", w.Code, w.Body)
	}
	for name, n := range map[string]*hookNode{"a": a, "b": b, "c": c} {
		if got := n.ids(); !slices.Equal(got, []string{made.ID}) || n.idempotency[0] != "" {
			t.Fatalf("node %s holds %v (Idempotency-Key %q sent), want %s alone and no key", name, got, n.idempotency[0], made.ID)
		}
	}
	// The retry (same key) names the same id: still one webhook on each node.
	if w := call("POST", "/v1/webhooks", create, "Idempotency-Key", "key-1"); w.Code != 201 || !strings.Contains(w.Body.String(), made.ID) || len(a.ids()) != 1 {
		t.Fatalf("the retry: %d %s; node-a holds %v", w.Code, w.Body, a.ids())
	}

	// Reads: one webhook, its delivery state summed over the nodes; the last attempt the
	// latest node's (node-c's, status 204).
	var page struct {
		Items []struct {
			ID       string
			Delivery struct {
				Pending, Delivered int
				LastStatus         int `json:"last_status"`
			}
		}
	}
	if w := call("GET", "/v1/webhooks", ""); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &page) != nil || len(page.Items) != 1 {
		t.Fatalf("the list: %d %s", w.Code, w.Body)
	}
	if d := page.Items[0].Delivery; page.Items[0].ID != made.ID || d.Pending != 3 || d.Delivered != 7 || d.LastStatus != 204 {
		t.Fatalf("the merged delivery state %+v, want pending 3, delivered 7, last status 204", page.Items[0])
	}
	if w := call("GET", "/v1/webhooks/"+made.ID, ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"delivered":7`) {
		t.Fatalf("the read: %d %s", w.Code, w.Body)
	}

	// node-c refuses: the others' are undone, and the refusal is the answer.
	set := func(f func()) {
		a.mu.Lock()
		b.mu.Lock()
		c.mu.Lock()
		f()
		c.mu.Unlock()
		b.mu.Unlock()
		a.mu.Unlock()
	}
	set(func() { c.refuse = true })
	if w := call("POST", "/v1/webhooks", create); w.Code != 429 || code(w) != "limit-reached" {
		t.Fatalf("a create node-c refuses: %d %s, want its 429", w.Code, w.Body)
	}
	if len(a.ids()) != 1 || len(b.ids()) != 1 {
		t.Fatalf("after the refused create: a %v, b %v; want only the first webhook (the other undone)", a.ids(), b.ids())
	}
	// ... and when the undo fails on node-b, the answer says where it is left.
	set(func() { b.failDelete = true })
	w = call("POST", "/v1/webhooks", create)
	if w.Code != 502 || !strings.Contains(w.Body.String(), "node-b") || !strings.Contains(w.Body.String(), "same id") {
		t.Fatalf("a refused create whose undo failed: %d %s, want 502 naming node-b", w.Code, w.Body)
	}
	set(func() { b.failDelete, c.refuse = false, false })

	// A delete reaches every node; then none holds it.
	if w := call("DELETE", "/v1/webhooks/"+made.ID, ""); w.Code != 204 {
		t.Fatalf("the delete: %d %s", w.Code, w.Body)
	}
	if slices.Contains(a.ids(), made.ID) || slices.Contains(b.ids(), made.ID) || len(c.ids()) != 0 {
		t.Fatalf("after the delete: a %v, b %v, c %v", a.ids(), b.ids(), c.ids())
	}
	if w := call("DELETE", "/v1/webhooks/"+made.ID, ""); w.Code != 404 {
		t.Fatalf("a second delete: %d %s, want 404", w.Code, w.Body)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("the router logged a webhook's secret:\n%s", logs.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
