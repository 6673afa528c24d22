package tests

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/openapi"
)

// TestClusterWebhooks: a webhook made through a real router in front of two real nodes
// (docs/cluster.md, "Webhooks") exists on both under one id, so the receiver (on loopback,
// started by the test, checking every signature) gets the events of sandboxes on both nodes,
// each delivery naming that one id; the router's list and read show it once, with the
// deliveries of both nodes counted; a node that joins later lacks it until the create is
// repeated with the same id, which is idempotent on the nodes that hold it; the same id with
// another secret is refused; a create one node refuses (it holds 32 webhooks) is undone on
// the others; a delete through the router removes it from every node.
// Without the routing every call answered 501.
func TestClusterWebhooks(t *testing.T) {
	requireRoot(t)
	cp, admin, _ := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	const secret = "a-cluster-receiver-secret-0123456789"
	start := func(name string) *daemon {
		return startClusterNode(t, cp, admin, name, withToken(nodeToken), withArgs("--webhook-allow-private",
			"--cluster-max-sandboxes", "10", "--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	nodes := map[string]*daemon{"hook-a": start("hook-a"), "hook-b": start("hook-b")}
	routerURL, router := startRouterProcess(t, cp, routerToken, nodeToken)
	rt := &daemon{t: t, URL: routerURL, Token: routerToken}
	recv := newClusterReceiver(t, secret)

	create := map[string]any{"url": recv.srv.URL + "/hook", "events": []string{"sandbox.created"}, "secret": secret}
	wh := decode[webhookJSON](t, rt.do("POST", "/v1/webhooks", jsonBody(t, create), http.Header{"Idempotency-Key": {"cluster-hook-1"}}), 201)
	for name, d := range nodes {
		if got := decode[webhookJSON](t, d.doJSON("GET", "/v1/webhooks/"+wh.ID, nil), 200); got.URL != create["url"] {
			t.Fatalf("the webhook on %s: %+v", name, got)
		}
	}
	// The client's retry (same Idempotency-Key) names the same id: one webhook on each node.
	if again := decode[webhookJSON](t, rt.do("POST", "/v1/webhooks", jsonBody(t, create), http.Header{"Idempotency-Key": {"cluster-hook-1"}}), 201); again.ID != wh.ID {
		t.Fatalf("the retry made %s, want %s again", again.ID, wh.ID)
	}
	for name, d := range nodes {
		if l := decode[webhookListJSON](t, d.doJSON("GET", "/v1/webhooks", nil), 200); len(l.Items) != 1 {
			t.Fatalf("%s holds %d webhooks after the retry, want 1", name, len(l.Items))
		}
	}

	// A sandbox on each node: the receiver gets both creations, from the one webhook.
	nodes["hook-a"].create("on-a", false)
	nodes["hook-b"].create("on-b", false)
	waitCond(t, 30*time.Second, "both nodes' sandbox.created delivered", func() (bool, error) {
		return recv.took("sandbox.created", "on-a") && recv.took("sandbox.created", "on-b"), nil
	})
	if ids := recv.webhookIDs(); !slices.Equal(ids, []string{wh.ID}) {
		t.Fatalf("deliveries named the webhooks %v, want %s alone", ids, wh.ID)
	}
	waitCond(t, 30*time.Second, "the router's read counting both nodes' deliveries", func() (bool, error) {
		got := decode[webhookJSON](t, rt.doJSON("GET", "/v1/webhooks/"+wh.ID, nil), 200)
		return got.Delivery.Delivered >= 2 && got.Delivery.Pending == 0, nil
	})
	if l := decode[webhookListJSON](t, rt.doJSON("GET", "/v1/webhooks", nil), 200); len(l.Items) != 1 || l.Items[0].ID != wh.ID || l.Items[0].Delivery.Delivered < 2 {
		t.Fatalf("the router's list: %+v, want %s once with both nodes' deliveries", l, wh.ID)
	}

	// A node that joins later lacks it; the create repeated with the id makes it there.
	nodes["hook-c"] = start("hook-c")
	waitRouterLive(t, rt, "hook-c")
	wantProblem(t, nodes["hook-c"].doJSON("GET", "/v1/webhooks/"+wh.ID, nil), 404, "webhook-not-found")
	create["id"] = wh.ID
	decode[webhookJSON](t, rt.do("POST", "/v1/webhooks", jsonBody(t, create), nil), 201)
	nodes["hook-c"].create("on-c", false)
	waitCond(t, 30*time.Second, "hook-c's sandbox.created delivered", func() (bool, error) {
		return recv.took("sandbox.created", "on-c"), nil
	})
	other := map[string]any{"id": wh.ID, "url": create["url"], "events": create["events"], "secret": secret + "-other"}
	wantProblem(t, rt.do("POST", "/v1/webhooks", jsonBody(t, other), nil), 409, "webhook-exists")

	// hook-b full (32 webhooks): a create through the router is refused there, and undone on
	// the nodes that made it before (hook-a, in name order), so that no node delivers it.
	var filler []string
	for range 31 {
		f := decode[webhookJSON](t, nodes["hook-b"].do("POST", "/v1/webhooks", jsonBody(t, map[string]any{
			"url": recv.srv.URL + "/filler", "events": []string{"sandbox.deleted"}, "secret": secret}), nil), 201)
		filler = append(filler, f.ID)
	}
	fresh := map[string]any{"url": recv.srv.URL + "/fresh", "events": []string{"sandbox.created"}, "secret": secret}
	wantProblem(t, rt.do("POST", "/v1/webhooks", jsonBody(t, fresh), nil), 429, "limit-reached")
	for _, name := range []string{"hook-a", "hook-c"} {
		if l := decode[webhookListJSON](t, nodes[name].doJSON("GET", "/v1/webhooks", nil), 200); len(l.Items) != 1 || l.Items[0].ID != wh.ID {
			t.Fatalf("%s after a create hook-b refused: %+v, want %s alone (the create undone)", name, l.Items, wh.ID)
		}
	}
	for _, id := range filler {
		if r := nodes["hook-b"].doJSON("DELETE", "/v1/webhooks/"+id, nil); r.Status != 204 {
			t.Fatalf("delete filler %s: %d %s", id, r.Status, r.Body)
		}
	}

	if r := rt.doJSON("DELETE", "/v1/webhooks/"+wh.ID, nil); r.Status != 204 {
		t.Fatalf("delete through the router: %d %s", r.Status, r.Body)
	}
	for _, d := range nodes {
		wantProblem(t, d.doJSON("GET", "/v1/webhooks/"+wh.ID, nil), 404, "webhook-not-found")
	}
	wantProblem(t, rt.doJSON("GET", "/v1/webhooks/"+wh.ID, nil), 404, "webhook-not-found")
	if strings.Contains(router.logs.String(), secret) {
		t.Fatal("the router logged the webhook's secret")
	}
	for name, d := range nodes {
		if strings.Contains(d.logs.String(), secret) {
			t.Fatalf("%s logged the webhook's secret", name)
		}
	}
}

type webhookListJSON struct {
	Items []webhookJSON `json:"items"`
}

// clusterReceiver is a webhook receiver on loopback that takes every delivery, checking its
// signature independently of package webhook, and records each event's type and sandbox and
// the webhook id that delivered it.
type clusterReceiver struct {
	t      *testing.T
	secret string
	srv    *httptest.Server

	mu    sync.Mutex
	seen  map[string]bool // "<type> <sandbox>"
	hooks map[string]bool
}

func newClusterReceiver(t *testing.T, secret string) *clusterReceiver {
	r := &clusterReceiver{t: t, secret: secret, seen: map[string]bool{}, hooks: map[string]bool{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		if err != nil {
			t.Errorf("reading a delivery: %v", err)
			return
		}
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(req.Header.Get("Bothy-Timestamp") + "."))
		m.Write(body)
		if want := "v1=" + hex.EncodeToString(m.Sum(nil)); !hmac.Equal([]byte(req.Header.Get("Bothy-Signature")), []byte(want)) {
			t.Errorf("a delivery's signature does not verify")
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var e openapi.Event
		if err := json.Unmarshal(body, &e); err != nil || e.Sandbox == nil {
			t.Errorf("a delivery's body is not a sandbox's event: %v: %s", err, body)
			return
		}
		r.mu.Lock()
		r.seen[e.Type+" "+*e.Sandbox] = true
		r.hooks[req.Header.Get("Bothy-Webhook-Id")] = true
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *clusterReceiver) took(typ, sandbox string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[typ+" "+sandbox]
}

func (r *clusterReceiver) webhookIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.hooks {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
