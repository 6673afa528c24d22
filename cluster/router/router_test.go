package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/internal/forwarded"
)

const ns = "bothy-system"

// newRouter is a router over a fake API server holding a node "up" (lease renewed now) and a
// node "down" (lease renewed a minute ago), each with one sandbox, and "up" answering at
// upURL.
// testScheme is the scheme of the routers' fake clients: Kubernetes' own types and the
// cluster's.
func testScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// testLease is node name's lease as the node writes it: held by the node, renewed at
// renewed, for seconds.
func testLease(name string, renewed time.Time, seconds int32) *coordinationv1.Lease {
	id := name
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node.LeaseName(name)},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &seconds, RenewTime: &metav1.MicroTime{Time: renewed}},
	}
}

func newRouter(t *testing.T, upURL string) *Router {
	t.Helper()
	scheme := testScheme(t)
	bn := func(name, addr string) *v1alpha1.BothyNode {
		return &v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.BothyNodeStatus{Address: addr, Health: v1alpha1.NodeHealthy}}
	}
	sb := func(id, on string) *v1alpha1.Sandbox {
		return &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}, Status: v1alpha1.SandboxStatus{Node: on, State: v1alpha1.StateRunning}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		testLease("up", time.Now(), 15), testLease("down", time.Now().Add(-time.Minute), 15),
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
		// The router names its client (httptest's 192.0.2.1) with proof, in place of
		// whatever name the client sent.
		if c, ok := forwarded.Client(r.Header, "node-token"); !ok || c != "192.0.2.1" {
			w.WriteHeader(http.StatusBadRequest)
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
		{"on no node: a live node answers, as one node would", "GET", "/v1/sandboxes/nowhere", "client-token", 418, ""},
		{"not routed", "GET", "/v1/no-such-resource", "client-token", 501, "not-implemented"},
		{"health without a token", "GET", "/healthz", "", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(tt.method, tt.path, nil)
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			req.Header.Set(forwarded.Header, "203.0.113.1 a-client-names-itself")
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

// TestListLostNode: the list through the router holds a lost node's sandboxes, from their
// objects, in the state node-lost, merged in id order with the live nodes' own lists; the
// state and label filters and the cursor apply to them as a node applies them.
func TestListLostNode(t *testing.T) {
	t.Parallel()
	asked := make(chan string, 16)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked <- r.URL.RawQuery
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"items":[{"id":"on-up","state":"running"}]}`))
	}))
	t.Cleanup(up.Close)
	rt := newRouter(t, up.URL)
	// Another lost sandbox, labelled, and an object placed on the lost node but never made.
	for _, o := range []*v1alpha1.Sandbox{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a-lost"}, Spec: v1alpha1.SandboxSpec{Image: "host", Labels: map[string]string{"team": "a"},
			Resources: v1alpha1.Resources{VCPUs: 1, MemoryMB: 256, Pids: 512}}, Status: v1alpha1.SandboxStatus{Node: "down", State: v1alpha1.StateRunning}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b-unmade"}, Spec: v1alpha1.SandboxSpec{NodeName: "down"}},
	} {
		if err := rt.cfg.Client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	type sandbox struct {
		ID, State, Runtime string
		Labels             map[string]string
		Resources          struct {
			MemoryMB int `json:"memory_mb"`
		}
	}
	list := func(query string) (ids, states []string, items []sandbox) {
		t.Helper()
		req := httptest.NewRequest("GET", "/v1/sandboxes"+query, nil)
		req.Header.Set("Authorization", "Bearer client-token")
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, req)
		var page struct{ Items []sandbox }
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &page) != nil {
			t.Fatalf("list %s: %d %s", query, w.Code, w.Body)
		}
		for _, s := range page.Items {
			ids, states = append(ids, s.ID), append(states, s.State)
		}
		return ids, states, page.Items
	}
	ids, states, items := list("")
	if !slices.Equal(ids, []string{"a-lost", "on-down", "on-up"}) || !slices.Equal(states, []string{"node-lost", "node-lost", "running"}) {
		t.Fatalf("the list: %v %v; want a-lost and on-down node-lost, on-up running", ids, states)
	}
	if s := items[0]; s.Runtime != "namespace" || s.Resources.MemoryMB != 256 || s.Labels["team"] != "a" {
		t.Fatalf("a-lost as listed: %+v; want the object's runtime, memory and labels", s)
	}
	<-asked
	if ids, _, _ := list("?state=node-lost"); !slices.Equal(ids, []string{"a-lost", "on-down"}) {
		t.Fatalf("state=node-lost: %v", ids)
	}
	select {
	case q := <-asked:
		t.Fatalf("the live node was asked (%s) for a state only the router knows", q)
	default:
	}
	if ids, _, _ := list("?state=running"); !slices.Equal(ids, []string{"on-up"}) {
		t.Fatalf("state=running: %v", ids)
	}
	if ids, _, _ := list("?label=team%3Da"); !slices.Equal(ids, []string{"a-lost", "on-up"}) { // the fake node ignores labels
		t.Fatalf("label=team=a: %v", ids)
	}
	if ids, _, _ := list("?cursor=a-lost&limit=1"); !slices.Equal(ids, []string{"on-down"}) {
		t.Fatalf("after a-lost, one: %v", ids)
	}
}

// TestProxyFullDuplex: a node that answers before it has read the whole request body (a
// Connect stream sends its first event at once) goes on receiving the body through the
// router, and its answer reaches the client uncut. Without full duplex the router's server
// gave up the request body once the answer's headers went out, and the transport dropped the
// connection to the node mid-answer (E2B streams cut in TestClusterE2BFlow).
func TestProxyFullDuplex(t *testing.T) {
	t.Parallel()
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		br := bufio.NewReader(r.Body)
		first, _ := br.ReadString('\n')
		_, _ = io.WriteString(w, "got "+first)
		w.(http.Flusher).Flush()
		rest, _ := io.ReadAll(br)
		_, _ = io.WriteString(w, "then "+string(rest))
	}))
	router := httptest.NewServer(newRouter(t, node.URL))
	body, send := io.Pipe()
	// A failure must not hang the cleanup on the streams left open.
	t.Cleanup(func() {
		_ = send.CloseWithError(io.ErrUnexpectedEOF)
		router.CloseClientConnections()
		node.CloseClientConnections()
		router.Close()
		node.Close()
	})

	// The exchange runs apart, so that a router that stalls it fails the test at a deadline.
	failed := make(chan string, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", router.URL+"/v1/sandboxes/on-up/exec/stream", body)
		req.Header.Set("Authorization", "Bearer client-token")
		go func() { _, _ = io.WriteString(send, "first\n") }()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			failed <- err.Error()
			return
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); err != nil || line != "got first\n" {
			failed <- fmt.Sprintf("the node's first answer: %q, %v", line, err)
			return
		}
		_, _ = io.WriteString(send, "second\n")
		_ = send.Close()
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "then second\n" {
			failed <- fmt.Sprintf("the rest of the answer: %q, %v; want the node to have read the whole body", rest, err)
			return
		}
		failed <- ""
	}()
	select {
	case msg := <-failed:
		if msg != "" {
			t.Fatal(msg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exchange through the router stalled: the node never got the rest of the body")
	}
}

// TestIdempotencyKeyOnlyWithTheClientsCall: nodeCall sends the client's Idempotency-Key with
// the client's own call (its method and path) and with no call the router makes of its own.
func TestIdempotencyKeyOnlyWithTheClientsCall(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Idempotency-Key")
	}))
	t.Cleanup(srv.Close)
	rt := newRouter(t, srv.URL)
	n := &nodeView{obj: v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: v1alpha1.BothyNodeStatus{Address: srv.URL}}}
	req := httptest.NewRequest("POST", "/v1/images", nil)
	req.Header.Set("Idempotency-Key", "key-1")
	for _, c := range []struct {
		method, path, want string
	}{
		{"POST", "/v1/images", "key-1"},
		{"GET", "/v1/images", ""},
		{"POST", "/v1/templates", ""},
	} {
		if _, _, _, err := rt.nodeCall(req, n, c.method, c.path, "", nil, rt.nodeAuth); err != nil {
			t.Fatal(err)
		}
		if key := <-got; key != c.want {
			t.Errorf("%s %s carried Idempotency-Key %q, want %q", c.method, c.path, key, c.want)
		}
	}
}
