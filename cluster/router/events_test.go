package router

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// sseNode is a node's /v1/events as bothyd serves it: ids that grow, a replay of the events
// after a Last-Event-ID, and the stream left open.
type sseNode struct {
	srv    *httptest.Server
	mu     sync.Mutex
	seq    int64
	events []string // the data of event i+1
	more   chan struct{}
}

func newSSENode(t *testing.T) *sseNode {
	n := &sseNode{more: make(chan struct{})}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" || r.Header.Get("Authorization") != "Bearer node-token" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		after, err := strconv.ParseInt(r.Header.Get("Last-Event-ID"), 10, 64)
		if err != nil {
			n.mu.Lock()
			after = n.seq
			n.mu.Unlock()
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprint(w, "retry: 2000\n: connected\n\n")
		w.(http.Flusher).Flush()
		for {
			n.mu.Lock()
			for after < n.seq {
				after++
				_, _ = fmt.Fprintf(w, "id: %d\nevent: sandbox.created\ndata: %s\n\n", after, n.events[after-1])
			}
			more := n.more
			n.mu.Unlock()
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-more:
			}
		}
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *sseNode) publish(data string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	n.events = append(n.events, data)
	close(n.more)
	n.more = make(chan struct{})
}

// sseClient reads a router's stream.
type sseClient struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func openEvents(t *testing.T, url, lastID string) *sseClient {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", url+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer client-token")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("opening the stream: %v %v", resp, err)
	}
	return &sseClient{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next is the next event's id and data.
func (c *sseClient) next(t *testing.T) (id, data string) {
	t.Helper()
	for c.sc.Scan() {
		line := c.sc.Text()
		switch {
		case line == "" && data != "":
			return id, data
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case strings.HasPrefix(line, "data: "):
			data = line[6:]
		}
	}
	t.Fatalf("the stream ended: %v", c.sc.Err())
	return "", ""
}

// TestEventsAcrossRouters: two routers over the same two nodes; a client reads part of the
// merged stream through one, and resumes through the other with the last id it saw: it gets
// exactly the rest, of both nodes, with none missed and none twice.
func TestEventsAcrossRouters(t *testing.T) {
	t.Parallel()
	a, b := newSSENode(t), newSSENode(t)
	scheme := testScheme(t)
	var objs []client.Object
	for name, n := range map[string]*sseNode{"node-a": a, "node-b": b} {
		objs = append(objs, testLease(name, time.Now(), 60),
			&v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.BothyNodeStatus{Address: n.srv.URL, Health: v1alpha1.NodeHealthy}})
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var urls []string
	routers := []*Router{}
	for range 2 {
		rt, err := New(Config{Client: c, Namespace: ns, Token: "client-token", NodeToken: "node-token"})
		if err != nil {
			t.Fatal(err)
		}
		go rt.Run(ctx)
		srv := httptest.NewServer(rt)
		t.Cleanup(srv.Close)
		urls, routers = append(urls, srv.URL), append(routers, rt)
	}
	// Events kept from before any client: a resumed client with no position for a node gets
	// them; a new client does not.
	a.publish(`"a0"`)
	waitFollowing := func(rt *Router, node string, seq int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			rt.events.mu.Lock()
			f := rt.events.followers[node]
			ok := f != nil && f.latest >= seq
			rt.events.mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the router did not hold %s's event %d", node, seq)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFollowing(routers[0], "node-a", 1)
	waitFollowing(routers[1], "node-a", 1)

	first := openEvents(t, urls[0], "")
	for i := 1; i <= 3; i++ {
		a.publish(fmt.Sprintf(`"a%d"`, i))
		b.publish(fmt.Sprintf(`"b%d"`, i))
	}
	seen := map[string]bool{}
	var last string
	for range 4 {
		id, data := first.next(t)
		if seen[data] || data == `"a0"` {
			t.Fatalf("%s through the first router: twice, or from before the stream", data)
		}
		seen[data], last = true, id
	}
	first.resp.Body.Close()
	// More while the client is away, then it comes back through the other router.
	for i := 4; i <= 5; i++ {
		a.publish(fmt.Sprintf(`"a%d"`, i))
		b.publish(fmt.Sprintf(`"b%d"`, i))
	}
	second := openEvents(t, urls[1], last)
	for len(seen) < 10 {
		_, data := second.next(t)
		if seen[data] || data == `"a0"` {
			t.Fatalf("%s through the second router after %v: twice, or from before the stream", data, seen)
		}
		seen[data] = true
	}
	// Nothing more is owed: the next event is a new one.
	a.publish(`"a6"`)
	if _, data := second.next(t); data != `"a6"` {
		t.Fatalf("after the rest, %s; want the new a6", data)
	}
	second.resp.Body.Close()

	// An id no router sent starts the stream from now, as a node does.
	third := openEvents(t, urls[1], "17")
	b.publish(`"b6"`)
	if _, data := third.next(t); data != `"b6"` {
		t.Fatalf("with a foreign id, %s; want the new b6", data)
	}
	third.resp.Body.Close()
}

func TestCursor(t *testing.T) {
	t.Parallel()
	pos := map[uint32]int64{nodeKey("node-a"): 7, nodeKey("node-b"): 1 << 40, nodeKey("c"): 0}
	id := encodeCursor(pos)
	got, ok := decodeCursor(id)
	if !ok || len(got) != 3 || got[nodeKey("node-a")] != 7 || got[nodeKey("node-b")] != 1<<40 {
		t.Fatalf("decode(encode(%v)) = %v, %v", pos, got, ok)
	}
	if encodeCursor(got) != id {
		t.Fatal("the same position encodes differently")
	}
	for _, bad := range []string{"", "17", "c1.!!", "c1.AAAA", "c1." + strings.Repeat("A", 30000)} {
		if _, ok := decodeCursor(bad); ok {
			t.Errorf("decodeCursor(%q) accepted", bad)
		}
	}
}
