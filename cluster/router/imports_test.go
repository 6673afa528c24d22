package router

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// importNode is a fake node's image store for imports: the names it holds, the bytes of each
// import it took, and a size bound it answers 413 past, as a node's file limit does.
type importNode struct {
	mu       sync.Mutex
	images   map[string]bool
	imported map[string]int
	puts     int
	limit    int
	// firstChunk, when set, is closed once an import's first bytes arrived (before the rest
	// of the body was sent): the stream test waits for it.
	firstChunk chan struct{}
}

func (n *importNode) serve(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer node-token" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		name := strings.TrimPrefix(r.URL.Path, "/v1/images/")
		w.Header().Set("Content-Type", "application/json")
		switch r.Method {
		case "GET":
			n.mu.Lock()
			held := n.images[name]
			n.mu.Unlock()
			if !held {
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(`{"code":"image-not-found"}`))
				return
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"name": name, "state": "ready"})
		case "PUT":
			n.mu.Lock()
			n.puts++
			first := n.firstChunk
			n.firstChunk = nil
			n.mu.Unlock()
			buf := make([]byte, 32<<10)
			total := 0
			for {
				k, err := r.Body.Read(buf)
				total += k
				if k > 0 && first != nil {
					close(first)
					first = nil
				}
				if n.limit > 0 && total > n.limit {
					w.WriteHeader(http.StatusRequestEntityTooLarge)
					_, _ = w.Write([]byte(`{"code":"payload-too-large"}`))
					return
				}
				if err != nil {
					break
				}
			}
			n.mu.Lock()
			n.images[name], n.imported[name] = true, total
			n.mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]string{"name": name, "state": "ready"})
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestImageImportRouted: an import through the router goes to one node, streamed: the node
// with the most room when no node holds the name, then the node that holds it; a name two
// nodes hold is refused (409) with no node's image touched; the node's size bound answers
// through the router; a create of the image sent at once is placed on the importing node.
func TestImageImportRouted(t *testing.T) {
	t.Parallel()
	a := &importNode{images: map[string]bool{}, imported: map[string]int{}, limit: 1 << 20}
	b := &importNode{images: map[string]bool{}, imported: map[string]int{}, limit: 1 << 20}
	rt := routerOver(t, map[string]string{"node-a": a.serve(t), "node-b": b.serve(t)})
	// node-b has the more room: 8 slots of 10 free against node-a's 2.
	for name, free := range map[string]int32{"node-a": 2, "node-b": 8} {
		var n v1alpha1.BothyNode
		if err := rt.cfg.Client.Get(t.Context(), client.ObjectKey{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		n.Status.Capacity = v1alpha1.Capacity{MemoryMB: 10000, MilliCPU: 10000, Sandboxes: 10}
		n.Status.Free = v1alpha1.Capacity{MemoryMB: 10000, MilliCPU: 10000, Sandboxes: free}
		if err := rt.cfg.Client.Update(t.Context(), &n); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(rt)
	t.Cleanup(srv.Close)
	put := func(name string, body io.Reader) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), "PUT", srv.URL+"/v1/images/"+name, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer client-token")
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p struct{ Code string }
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p.Code
	}

	// Streamed: the node has the first bytes before the client sends the rest. A router
	// that buffered the archive would wait for the end, which never comes before the node's
	// signal: the import would hang until the deadline.
	firstChunk := make(chan struct{})
	b.firstChunk = firstChunk
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write(bytes.Repeat([]byte{1}, 1000))
		select {
		case <-firstChunk:
			_, _ = pw.Write(bytes.Repeat([]byte{2}, 2000))
			_ = pw.Close()
		case <-time.After(20 * time.Second):
			_ = pw.CloseWithError(io.ErrUnexpectedEOF)
		}
	}()
	if status, code := put("tool", pr); status != 201 {
		t.Fatalf("the import of tool: %d %s, want 201", status, code)
	}
	if b.imported["tool"] != 3000 || a.puts != 0 {
		t.Fatalf("tool imported on b with %d bytes (want 3000), puts on a %d (want 0): it goes to the node with the most room alone", b.imported["tool"], a.puts)
	}
	views, err := rt.nodes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rt.withRecentImport(views, "tool")
	if holders := imageHolders(views, "tool"); len(holders) != 1 || holders["node-b"] == nil {
		t.Fatalf("the holders of tool for placement just after its import: %v, want node-b", holders)
	}

	// node-a holds a name already: its import replaces it there, though node-b has more room.
	a.images["own"] = true
	if status, code := put("own", strings.NewReader("archive")); status != 201 || a.imported["own"] != 7 || b.puts != 1 {
		t.Fatalf("the import of own: %d %s, on a %d bytes, puts on b %d; want 201 on node-a alone", status, code, a.imported["own"], b.puts)
	}
	// A name both hold: refused, nothing sent.
	a.images["tool"] = true
	if status, code := put("tool", strings.NewReader("archive")); status != 409 || code != "already-provisioned" || a.puts != 1 || b.puts != 1 {
		t.Fatalf("the import of a name both nodes hold: %d %s (puts a %d, b %d), want 409 already-provisioned and no put", status, code, a.puts, b.puts)
	}
	// The node's size bound answers through the router.
	if status, code := put("huge", bytes.NewReader(make([]byte, 2<<20))); status != 413 || code != "payload-too-large" {
		t.Fatalf("an import past the node's bound: %d %s, want 413 payload-too-large", status, code)
	}
}
