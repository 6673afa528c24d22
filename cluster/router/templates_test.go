package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// templateNode is a fake node's template store and sandboxes; it records the calls it gets.
type templateNode struct {
	mu        sync.Mutex
	sandboxes map[string]bool
	templates map[string]*fakeTemplate
	calls     []string
}

type fakeTemplate struct {
	next int
	gens map[string]*fakeGeneration
}

type fakeGeneration struct {
	state  string
	leases int
}

func newTemplateNode(sandboxes ...string) *templateNode {
	n := &templateNode{sandboxes: map[string]bool{}, templates: map[string]*fakeTemplate{}}
	for _, s := range sandboxes {
		n.sandboxes[s] = true
	}
	return n
}

func (n *templateNode) template(name string, gens map[string]*fakeGeneration) {
	t := &fakeTemplate{gens: map[string]*fakeGeneration{}}
	for id, g := range gens {
		t.gens[id] = g
		if k, _ := strconv.Atoi(strings.TrimPrefix(id, "g")); k > t.next {
			t.next = k
		}
	}
	n.templates[name] = t
}

func (n *templateNode) record(name string) map[string]any {
	t := n.templates[name]
	out := map[string]any{"name": name, "created_at": "2026-01-01T00:00:00Z", "generations": len(t.gens)}
	latest := ""
	for id, g := range t.gens {
		if g.state == "active" && id > latest {
			latest = id
		}
	}
	if latest != "" {
		out["latest"] = latest
	}
	return out
}

func genRecord(tmpl, id string, g *fakeGeneration) map[string]any {
	return map[string]any{"id": id, "template": tmpl, "state": g.state, "leases": g.leases}
}

// page cuts keys, sorted, after cursor at limit, as a node's paginate does.
func page(r *http.Request, keys []string) ([]string, string) {
	sort.Strings(keys)
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		limit, _ = strconv.Atoi(v)
	}
	var out []string
	for _, k := range keys {
		if k <= r.URL.Query().Get("cursor") {
			continue
		}
		if len(out) == limit {
			return out, out[len(out)-1]
		}
		out = append(out, k)
	}
	return out, ""
}

func (n *templateNode) serve(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.calls = append(n.calls, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		fail := func(status int, code string) {
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "code": code})
		}
		ok := func(status int, v any) {
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(v)
		}
		if r.Header.Get("Authorization") != "Bearer node-token" {
			fail(401, "unauthorized")
			return
		}
		if id, found := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/"); found {
			if n.sandboxes[id] {
				ok(200, map[string]any{"id": id})
			} else {
				fail(404, "sandbox-not-found")
			}
			return
		}
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/templates"), "/")[1:]
		if len(parts) == 0 {
			if r.Method == "POST" {
				var body struct{ Name string }
				_ = json.NewDecoder(r.Body).Decode(&body)
				if n.templates[body.Name] != nil {
					fail(409, "template-exists")
					return
				}
				n.template(body.Name, nil)
				ok(201, n.record(body.Name))
				return
			}
			names := make([]string, 0, len(n.templates))
			for name := range n.templates {
				names = append(names, name)
			}
			keys, next := page(r, names)
			items := []any{}
			for _, k := range keys {
				items = append(items, n.record(k))
			}
			ok(200, map[string]any{"items": items, "next_cursor": next})
			return
		}
		tm := n.templates[parts[0]]
		if tm == nil {
			fail(404, "template-not-found")
			return
		}
		switch {
		case len(parts) == 1 && r.Method == "GET":
			ok(200, n.record(parts[0]))
		case len(parts) == 1 && r.Method == "DELETE":
			for _, g := range tm.gens {
				if g.leases > 0 && r.URL.Query().Get("drain") != "true" {
					fail(423, "generation-leased")
					return
				}
			}
			delete(n.templates, parts[0])
			w.WriteHeader(204)
		case len(parts) == 2 && r.Method == "POST":
			var body struct{ Sandbox string }
			_ = json.NewDecoder(r.Body).Decode(&body)
			if !n.sandboxes[body.Sandbox] {
				fail(404, "sandbox-not-found")
				return
			}
			tm.next++
			id := fmt.Sprintf("g%06d", tm.next)
			tm.gens[id] = &fakeGeneration{state: "active"}
			ok(201, genRecord(parts[0], id, tm.gens[id]))
		case len(parts) == 2 && r.Method == "GET":
			ids := make([]string, 0, len(tm.gens))
			for id := range tm.gens {
				ids = append(ids, id)
			}
			keys, next := page(r, ids)
			items := []any{}
			for _, k := range keys {
				items = append(items, genRecord(parts[0], k, tm.gens[k]))
			}
			ok(200, map[string]any{"items": items, "next_cursor": next})
		default:
			g := tm.gens[parts[2]]
			switch {
			case g == nil:
				fail(404, "generation-not-found")
			case len(parts) == 3 && r.Method == "GET":
				ok(200, genRecord(parts[0], parts[2], g))
			case len(parts) == 4 && parts[3] == "tombstone":
				g.state = "tombstoned"
				ok(200, genRecord(parts[0], parts[2], g))
			case len(parts) == 4 && parts[3] == "leases":
				items := []any{}
				for i := range g.leases {
					items = append(items, map[string]any{"sandbox": fmt.Sprintf("clone-%d", i)})
				}
				ok(200, map[string]any{"items": items})
			case len(parts) == 3 && r.Method == "DELETE" && g.leases > 0:
				fail(423, "generation-leased")
			default:
				delete(tm.gens, parts[2])
				w.WriteHeader(204)
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (n *templateNode) generations(name string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	t := n.templates[name]
	if t == nil {
		return nil
	}
	var out []string
	for id, g := range t.gens {
		out = append(out, id+":"+g.state)
	}
	sort.Strings(out)
	return out
}

// TestTemplatesAcrossNodes: templates through the router over three fake nodes. A create
// goes to every node (a second one is refused 409 as on one node); a capture goes to the
// node of the sandbox it names, and makes the template first on a node that lacks it, and
// placement sees the new generation on that node before its status lists it; the
// lists merge the nodes' pages by key with a cursor that pages on; a generation held by two
// nodes is read once, its leases counted over both; a tombstone reaches every holder; a
// delete is refused while any node's clones lease a generation, and drains with drain=true.
func TestTemplatesAcrossNodes(t *testing.T) {
	t.Parallel()
	a, b, c := newTemplateNode("sb-a"), newTemplateNode("sb-b"), newTemplateNode("sb-c")
	a.template("alpha", nil)
	b.template("beta", nil)
	rt := routerOver(t, map[string]string{"node-a": a.serve(t), "node-b": b.serve(t), "node-c": c.serve(t)})
	call := func(method, path, body string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer client-token")
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		return w
	}
	want := func(w *httptest.ResponseRecorder, status int, what string) {
		t.Helper()
		if w.Code != status {
			t.Fatalf("%s: %d %s, want %d", what, w.Code, w.Body, status)
		}
	}
	code := func(w *httptest.ResponseRecorder) string {
		var p struct{ Code string }
		_ = json.Unmarshal(w.Body.Bytes(), &p)
		return p.Code
	}

	want(call("POST", "/v1/templates", `{"name":"tools"}`), 201, "the create")
	for name, n := range map[string]*templateNode{"a": a, "b": b, "c": c} {
		if n.templates["tools"] == nil {
			t.Fatalf("node %s does not hold the template made through the router", name)
		}
	}
	if w := call("POST", "/v1/templates", `{"name":"tools"}`); w.Code != 409 || code(w) != "template-exists" {
		t.Fatalf("a second create: %d %s, want 409 template-exists", w.Code, w.Body)
	}

	// The capture goes to the sandbox's node alone.
	w := call("POST", "/v1/templates/tools/generations", `{"sandbox":"sb-b"}`)
	want(w, 201, "the capture of sb-b")
	if got := b.generations("tools"); !slices.Equal(got, []string{"g000001:active"}) || len(a.generations("tools")) != 0 || len(c.generations("tools")) != 0 {
		t.Fatalf("after the capture: a %v, b %v, c %v; want g000001 on b alone", a.generations("tools"), got, c.generations("tools"))
	}
	// Until node-b's status lists it, placement sees the capture there (the router's hint).
	views, err := rt.nodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rt.withRecentCapture(views, "tools")
	if got := views["node-b"].obj.Status.Generations; len(got) != 1 || got[0].Template != "tools" || got[0].Generation != "g000001" || len(views["node-a"].obj.Status.Generations) != 0 {
		t.Fatalf("node-b's generations for placement after the capture: %v", got)
	}
	if w := call("POST", "/v1/templates/tools/generations", `{"sandbox":"nowhere"}`); w.Code != 404 || code(w) != "sandbox-not-found" {
		t.Fatalf("a capture of no sandbox: %d %s, want 404 sandbox-not-found", w.Code, w.Body)
	}
	// alpha is held by node-a alone; a capture from node-c's sandbox makes it there first.
	want(call("POST", "/v1/templates/alpha/generations", `{"sandbox":"sb-c"}`), 201, "the capture of sb-c into alpha")
	if got := c.generations("alpha"); !slices.Equal(got, []string{"g000001:active"}) {
		t.Fatalf("node-c's alpha: %v, want g000001", got)
	}
	// A template no node holds is not made: the node answers template-not-found.
	if w := call("POST", "/v1/templates/ghost/generations", `{"sandbox":"sb-a"}`); w.Code != 404 || code(w) != "template-not-found" {
		t.Fatalf("a capture into no template: %d %s, want 404 template-not-found", w.Code, w.Body)
	}

	// Node a pulled b's generation, and clones lease it on both.
	a.mu.Lock()
	a.templates["tools"].gens["g000001"] = &fakeGeneration{state: "active", leases: 2}
	a.mu.Unlock()
	b.mu.Lock()
	b.templates["tools"].gens["g000001"].leases = 1
	b.mu.Unlock()

	// The template list merges by name, paging on.
	var tl struct {
		Items []struct {
			Name   string
			Latest string
		}
		NextCursor string `json:"next_cursor"`
	}
	w = call("GET", "/v1/templates?limit=2", "")
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &tl) != nil || len(tl.Items) != 2 || tl.Items[0].Name != "alpha" || tl.Items[1].Name != "beta" || tl.NextCursor != "beta" {
		t.Fatalf("the first page of templates: %d %s", w.Code, w.Body)
	}
	tl.Items, tl.NextCursor = nil, ""
	w = call("GET", "/v1/templates?limit=2&cursor=beta", "")
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &tl) != nil || len(tl.Items) != 1 || tl.Items[0].Name != "tools" || tl.Items[0].Latest != "g000001" || tl.NextCursor != "" {
		t.Fatalf("the second page of templates: %d %s", w.Code, w.Body)
	}
	// A read answers the node that holds the newest generation (c holds none of tools).
	var tr struct{ Latest string }
	if w := call("GET", "/v1/templates/tools", ""); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &tr) != nil || tr.Latest != "g000001" {
		t.Fatalf("the template's read: %d %s", w.Code, w.Body)
	}
	want(call("GET", "/v1/templates/ghost", ""), 404, "the read of no template")

	// A generation on two nodes: one record, its leases counted over both.
	var g struct {
		ID     string
		State  string
		Leases int
	}
	if w := call("GET", "/v1/templates/tools/generations/g000001", ""); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &g) != nil || g.Leases != 3 {
		t.Fatalf("the generation's read: %d %s, want 3 leases", w.Code, w.Body)
	}
	var gl struct {
		Items []struct {
			ID     string
			Leases int
		}
	}
	if w := call("GET", "/v1/templates/tools/generations", ""); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &gl) != nil || len(gl.Items) != 1 || gl.Items[0].Leases != 3 {
		t.Fatalf("the generations' list: %d %s, want g000001 once with 3 leases", w.Code, w.Body)
	}
	var ll struct{ Items []any }
	if w := call("GET", "/v1/templates/tools/generations/g000001/leases", ""); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &ll) != nil || len(ll.Items) != 3 {
		t.Fatalf("the leases: %d %s, want 3", w.Code, w.Body)
	}
	want(call("GET", "/v1/templates/tools/generations/g000009", ""), 404, "the read of no generation")

	// A tombstone reaches both holders; the merged read shows it.
	if w := call("POST", "/v1/templates/tools/generations/g000001/tombstone", ""); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &g) != nil || g.State != "tombstoned" {
		t.Fatalf("the tombstone: %d %s", w.Code, w.Body)
	}
	if a.generations("tools")[0] != "g000001:tombstoned" || b.generations("tools")[0] != "g000001:tombstoned" {
		t.Fatalf("after the tombstone: a %v, b %v", a.generations("tools"), b.generations("tools"))
	}
	// Leased on a and b: the delete is refused, and they keep it; drained, it goes.
	if w := call("DELETE", "/v1/templates/tools", ""); w.Code != 423 || code(w) != "generation-leased" {
		t.Fatalf("the delete of a leased template: %d %s, want 423 generation-leased", w.Code, w.Body)
	}
	if a.templates["tools"] == nil || b.templates["tools"] == nil {
		t.Fatal("a refused delete deleted the template on a node")
	}
	want(call("DELETE", "/v1/templates/tools?drain=true", ""), 204, "the drained delete")
	for name, n := range map[string]*templateNode{"a": a, "b": b, "c": c} {
		if n.templates["tools"] != nil {
			t.Fatalf("node %s still holds the deleted template", name)
		}
	}
	want(call("DELETE", "/v1/templates/tools", ""), 404, "the delete of a deleted template")
}
