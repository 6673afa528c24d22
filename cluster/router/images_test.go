package router

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// routerOver is a router over a fake API server holding live nodes answering at the URLs.
func routerOver(t *testing.T, nodes map[string]string) *Router {
	t.Helper()
	statuses := map[string]v1alpha1.BothyNodeStatus{}
	for name, url := range nodes {
		statuses[name] = v1alpha1.BothyNodeStatus{Address: url, Health: v1alpha1.NodeHealthy}
	}
	return routerOverStatus(t, statuses)
}

// routerOverStatus is a router over a fake API server holding live nodes of these statuses.
func routerOverStatus(t *testing.T, nodes map[string]v1alpha1.BothyNodeStatus) *Router {
	t.Helper()
	scheme := testScheme(t)
	var objs []client.Object
	for name, status := range nodes {
		objs = append(objs, testLease(name, time.Now(), 60),
			&v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: status})
	}
	rt, err := New(Config{Client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build(), Namespace: ns, Token: "client-token", NodeToken: "node-token"})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// TestImagesMerged: the image list through the router is every live node's, one entry a
// name (the ready one where a node is still pulling it), in name order as a node's; a call on
// images that the contract does not have answers 501 saying where to look.
func TestImagesMerged(t *testing.T) {
	t.Parallel()
	serve := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/images" || r.Header.Get("Authorization") != "Bearer node-token" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	rt := routerOver(t, map[string]string{
		"node-a": serve(`{"items":[{"name":"host","kind":"host","state":"ready"},{"name":"python","kind":"oci","state":"pulling"}]}`),
		"node-b": serve(`{"items":[{"name":"host","kind":"host","state":"ready"},{"name":"alpine","kind":"oci","state":"ready"},{"name":"python","kind":"oci","state":"ready"},{"name":"rootfs","kind":"directory","state":"ready"}]}`),
	})
	call := func(method, path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("Authorization", "Bearer client-token")
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		return w
	}
	w := call("GET", "/v1/images")
	var page struct {
		Items []struct{ Name, State string }
	}
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &page) != nil {
		t.Fatalf("the image list: %d %s", w.Code, w.Body)
	}
	var got []string
	for _, im := range page.Items {
		got = append(got, im.Name+":"+im.State)
	}
	if want := []string{"alpine:ready", "host:ready", "python:ready", "rootfs:ready"}; !slices.Equal(got, want) {
		t.Fatalf("merged %v, want %v", got, want)
	}
	for _, c := range []struct{ method, path string }{{"POST", "/v1/images/python"}} {
		w := call(c.method, c.path)
		var p struct{ Code, Detail string }
		if w.Code != 501 || json.Unmarshal(w.Body.Bytes(), &p) != nil || p.Code != "not-implemented" || p.Detail == "" {
			t.Fatalf("%s %s: %d %s, want 501 not-implemented with a detail", c.method, c.path, w.Code, w.Body)
		}
	}
}

// imageNode is a fake node's image store: name to state; it records the calls it gets.
type imageNode struct {
	mu     sync.Mutex
	images map[string]string
	inUse  map[string]bool
	calls  []string
}

func (n *imageNode) serve(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.calls = append(n.calls, r.Method+" "+r.URL.Path)
		name := strings.TrimPrefix(r.URL.Path, "/v1/images/")
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/images":
			var req struct{ Name string }
			_ = json.NewDecoder(r.Body).Decode(&req)
			n.images[req.Name] = "pulling"
			w.WriteHeader(http.StatusAccepted)
			_ = json.NewEncoder(w).Encode(map[string]string{"name": req.Name, "state": "pulling"})
		case r.Method == "GET" && n.images[name] != "":
			_ = json.NewEncoder(w).Encode(map[string]string{"name": name, "state": n.images[name]})
		case r.Method == "DELETE" && n.inUse[name]:
			w.WriteHeader(http.StatusLocked)
			_ = json.NewEncoder(w).Encode(map[string]string{"code": "image-in-use"})
		case r.Method == "DELETE" && n.images[name] != "":
			delete(n.images, name)
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"code": "image-not-found"})
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestImagesAcrossNodes: a pull through the router starts on every live node; a read is
// the least advanced node's record (pulling until every holder is ready, failed if one
// failed) and ignores a node without the image; a delete reaches every holder, and one
// still in use on a node answers 423 while the others' deletes stand.
func TestImagesAcrossNodes(t *testing.T) {
	t.Parallel()
	a := &imageNode{images: map[string]string{}, inUse: map[string]bool{}}
	b := &imageNode{images: map[string]string{}, inUse: map[string]bool{}}
	c := &imageNode{images: map[string]string{}, inUse: map[string]bool{}}
	rt := routerOver(t, map[string]string{"node-a": a.serve(t), "node-b": b.serve(t), "node-c": c.serve(t)})
	call := func(method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer client-token")
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		return w
	}
	state := func(path string) (int, string) {
		w := call("GET", path, "")
		var im struct{ State string }
		_ = json.Unmarshal(w.Body.Bytes(), &im)
		return w.Code, im.State
	}
	if w := call("POST", "/v1/images", `{"ref":"example.com/py:3","name":"py"}`); w.Code != 202 {
		t.Fatalf("pull: %d %s", w.Code, w.Body)
	}
	for _, n := range []*imageNode{a, b, c} {
		if n.images["py"] != "pulling" {
			t.Fatalf("a node did not get the pull: %v", n.calls)
		}
	}
	a.images["py"], b.images["py"] = "ready", "ready"
	if code, st := state("/v1/images/py"); code != 200 || st != "pulling" {
		t.Fatalf("two of three ready: %d %s, want pulling", code, st)
	}
	c.images["py"] = "failed"
	if code, st := state("/v1/images/py"); code != 200 || st != "failed" {
		t.Fatalf("one failed: %d %s, want failed", code, st)
	}
	delete(c.images, "py") // as if c never took the pull
	if code, st := state("/v1/images/py"); code != 200 || st != "ready" {
		t.Fatalf("ready on every holder: %d %s, want ready", code, st)
	}
	if code, _ := state("/v1/images/nothing"); code != 404 {
		t.Fatalf("an image no node holds: %d, want 404", code)
	}
	b.inUse["py"] = true
	if w := call("DELETE", "/v1/images/py", ""); w.Code != 423 {
		t.Fatalf("delete while b uses it: %d %s, want 423", w.Code, w.Body)
	}
	if a.images["py"] != "" || b.images["py"] == "" {
		t.Fatalf("after the refused delete: a %q (want deleted), b %q (want kept)", a.images["py"], b.images["py"])
	}
	b.inUse["py"] = false
	if w := call("DELETE", "/v1/images/py", ""); w.Code != 204 {
		t.Fatalf("delete again: %d %s, want 204", w.Code, w.Body)
	}
	if w := call("DELETE", "/v1/images/py", ""); w.Code != 404 {
		t.Fatalf("delete of a gone image: %d %s, want 404", w.Code, w.Body)
	}
}

// TestFanOutConcurrent: a call sent to every live node reaches them at once: each of three
// fake nodes holds its answer until all three have the call, which a router asking one node
// after another would never give (each node would wait for the others until its deadline).
func TestFanOutConcurrent(t *testing.T) {
	t.Parallel()
	var arrived sync.WaitGroup
	arrived.Add(3)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	nodes := map[string]string{}
	for _, name := range []string{"n1", "n2", "n3"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived.Done()
			select {
			case <-all:
				_, _ = w.Write([]byte(`{"name":"busybox","state":"ready"}`))
			case <-time.After(5 * time.Second):
				w.WriteHeader(http.StatusGatewayTimeout)
			}
		}))
		t.Cleanup(srv.Close)
		nodes[name] = srv.URL
	}
	rt := routerOver(t, nodes)
	status, body := call(t, rt, "GET", "/v1/images/busybox", "")
	if status != 200 {
		t.Fatalf("a read sent to three nodes: %d %s; want 200 from nodes asked at once", status, body)
	}
}
