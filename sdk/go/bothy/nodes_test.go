package bothy

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestNodes: the node calls reach their routes with their bodies (a null deadline to clear
// it, absent fields left out), and a single bothyd's refusal comes back as ErrNotACluster.
func TestNodes(t *testing.T) {
	t.Parallel()
	var seen []string
	cluster := true
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, r.Method+" "+r.URL.Path+" "+string(body))
		if !cluster {
			problem(w, 501, "not-a-cluster", "This bothyd is not a cluster router.")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		const n = `{"name":"node-a","live":true,"health":"Healthy","cordoned":true,"draining":false,"sandboxes":2,` +
			`"capacity":{"memory_mb":4096,"milli_cpu":8000,"sandboxes":10},"allocated":{"memory_mb":1024,"milli_cpu":2000,"sandboxes":2},` +
			`"free":{"memory_mb":3072,"milli_cpu":6000,"sandboxes":8}}`
		switch r.URL.Path {
		case "/v1/nodes":
			_, _ = io.WriteString(w, `{"items":[`+n+`]}`)
		case "/v1/nodes/node-a":
			_, _ = io.WriteString(w, n)
		default:
			problem(w, 404, "node-not-found", "No such node.")
		}
	}))
	ctx := context.Background()
	if list, err := c.Nodes(ctx); err != nil || len(list) != 1 || list[0].Free.Sandboxes != 8 || !list[0].Live {
		t.Fatalf("Nodes: %+v, %v", list, err)
	}
	if _, err := c.GetNode(ctx, "node-z"); !IsCode(err, ErrNodeNotFound) {
		t.Fatalf("GetNode of none: %v", err)
	}
	if n, err := c.CordonNode(ctx, "node-a"); err != nil || !n.Cordoned {
		t.Fatalf("CordonNode: %+v, %v", n, err)
	}
	if _, err := c.UncordonNode(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DrainNode(ctx, "node-a", time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	off := false
	if _, err := c.PatchNode(ctx, "node-a", NodeChange{Draining: &off, ClearDrainDeadline: true}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GET /v1/nodes ",
		"GET /v1/nodes/node-z ",
		`PATCH /v1/nodes/node-a {"cordoned":true}`,
		`PATCH /v1/nodes/node-a {"cordoned":false}`,
		`PATCH /v1/nodes/node-a {"drain_deadline":"2030-01-02T03:04:05Z","draining":true}`,
		`PATCH /v1/nodes/node-a {"drain_deadline":null,"draining":false}`,
	}
	for i := range want {
		if i >= len(seen) || trimNL(seen[i]) != want[i] {
			t.Fatalf("requests %q, want %q", seen, want)
		}
	}
	cluster = false
	if _, err := c.Nodes(ctx); !IsCode(err, ErrNotACluster) {
		t.Fatalf("Nodes of a single bothyd: %v, want ErrNotACluster", err)
	}
}

func trimNL(s string) string {
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	return s
}
