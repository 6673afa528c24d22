package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/portlink"
)

// TestClusterPortLinks: a port link made through router A opens, without any token, through
// router B (routers keep no record of links: the link's id carries its node's tag), reaching
// the service inside the sandbox on the right node of two; the links' lists go to the
// sandbox's node through either router and show no token; a revocation through B holds
// through A; a forged tag finds nothing; a link of a SIGKILLed node answers 503 node-lost,
// and works again once the node is back.
func TestClusterPortLinks(t *testing.T) {
	requireRoot(t)
	cp, admin, _ := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	names := []string{"node-a", "node-b"}
	nodes := map[string]*daemon{}
	for _, name := range names {
		nodes[name] = startClusterNode(t, cp, admin, name, withToken(nodeToken))
	}
	// One sandbox serving on each node, made on the node itself, so each is where the test
	// says; the routers find it through its Sandbox object.
	for _, name := range names {
		d, id := nodes[name], "lk-"+name
		d.create(id, true)
		d.portService(id)
		waitObject(t, admin, id+" mirrored", client.ObjectKey{Namespace: config.Namespace, Name: id}, &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
			if s.Status.Node != name {
				return fmt.Errorf("on %q", s.Status.Node)
			}
			return nil
		})
	}
	viaA := &daemon{t: t, URL: startRouter(t, cp, routerToken, nodeToken), Token: routerToken}
	viaB := &daemon{t: t, URL: startRouter(t, cp, routerToken, nodeToken), Token: routerToken}
	// open fetches a link's URL through a router, without any token and without following
	// redirects.
	noRedirect := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	open := func(router *daemon, path string) (int, http.Header, []byte) {
		t.Helper()
		resp, err := noRedirect.Get(router.URL + path)
		if err != nil {
			t.Fatalf("GET %s through %s: %v", path, router.URL, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	wantCode := func(what string, status int, body []byte, wantStatus int, code string) {
		t.Helper()
		var p problem
		if status != wantStatus || json.Unmarshal(body, &p) != nil || p.Code != code {
			t.Fatalf("%s: %d %s, want %d %s", what, status, body, wantStatus, code)
		}
	}

	links := map[string]linkJSON{}
	for _, name := range names {
		id := "lk-" + name
		l := decode[linkJSON](t, viaA.doJSON("POST", "/v1/sandboxes/"+id+"/ports/8000/links", map[string]any{"ttl_s": 600}), 201)
		if !strings.HasPrefix(l.ID, portlink.NodeTag(name)) || l.Path != "/p/"+l.Token+"/" {
			t.Fatalf("a link made on %s: %+v, want an id tagged %s", name, l, portlink.NodeTag(name))
		}
		links[name] = l
		// Through the other router, without a token: the service in the sandbox answers.
		status, _, body := open(viaB, l.Path+"hello?from="+name)
		var e echoed
		if status != 200 || json.Unmarshal(body, &e) != nil || e.Path != "/hello?from="+name {
			t.Fatalf("the link to %s through router B: %d %s", id, status, body)
		}
		// The service sees no credential, and the host its client asked for: router B's.
		forwardedHost := ""
		for k, v := range e.Headers {
			if strings.EqualFold(k, "Authorization") {
				t.Fatalf("the service saw an Authorization header through the link: %v", e.Headers)
			}
			if strings.EqualFold(k, "X-Forwarded-Host") {
				forwardedHost = v
			}
		}
		if want := strings.TrimPrefix(viaB.URL, "http://"); forwardedHost != want {
			t.Fatalf("the service saw X-Forwarded-Host %q, want router B's %q (headers %v)", forwardedHost, want, e.Headers)
		}
		status, h, _ := open(viaB, strings.TrimSuffix(l.Path, "/"))
		if status != http.StatusMovedPermanently || h.Get("Location") != l.Path {
			t.Fatalf("the link without its slash through router B: %d %q", status, h.Get("Location"))
		}
		// The lists reach the sandbox's node through either router, without tokens.
		for _, r := range []*daemon{viaA, viaB} {
			for _, path := range []string{"/v1/sandboxes/" + id + "/links", "/v1/sandboxes/" + id + "/ports/8000/links"} {
				resp := r.do("GET", path, nil, nil)
				var list struct {
					Items []linkInfoJSON `json:"items"`
				}
				if resp.Status != 200 || json.Unmarshal(resp.Body, &list) != nil || len(list.Items) != 1 ||
					list.Items[0].ID != l.ID || strings.Contains(string(resp.Body), l.Token[portlink.IDLen+1:]) {
					t.Fatalf("GET %s through %s: %d %s, want the one link %s without its token", path, r.URL, resp.Status, resp.Body, l.ID)
				}
			}
		}
	}
	// Each link reaches its own sandbox: a second service in each serves a file naming its
	// sandbox, and each node's link, through either router, answers that sandbox's name.
	for _, name := range names {
		id := "lk-" + name
		if got := nodes[name].exec(id, map[string]any{"command": []string{"sh", "-c",
			"mkdir -p /home/user/www && echo " + id + " > /home/user/www/id.txt && " +
				"setsid python3 -m http.server 8001 --bind 127.0.0.1 -d /home/user/www >/dev/null 2>&1 </dev/null &"}}); got.ExitCode != 0 {
			t.Fatalf("starting the file service in %s: %+v", id, got)
		}
		l := decode[linkJSON](t, viaB.doJSON("POST", "/v1/sandboxes/"+id+"/ports/8001/links", map[string]any{"ttl_s": 600}), 201)
		for _, r := range []*daemon{viaA, viaB} {
			waitFor(t, 30*time.Second, id+"'s file through its link", func() bool {
				status, _, body := open(r, l.Path+"id.txt")
				return status == 200 && strings.TrimSpace(string(body)) == id
			})
		}
	}

	// A token moved to the other node's tag finds a node without the link.
	a := links["node-a"]
	forged := portlink.NodeTag("node-b") + a.Token[portlink.TagLen:]
	status, _, body := open(viaA, "/p/"+forged+"/")
	wantCode("a token with another node's tag", status, body, 404, "link-not-found")
	status, _, body = open(viaA, "/p/"+portlink.NodeTag("node-z")+a.Token[portlink.TagLen:]+"/")
	wantCode("a token of no node", status, body, 404, "link-not-found")

	// Revoked through router B: gone through router A.
	if r := viaB.do("DELETE", "/v1/sandboxes/lk-node-a/ports/8000/links/"+a.ID, nil, nil); r.Status != 204 {
		t.Fatalf("revoking through router B: %d %s", r.Status, r.Body)
	}
	status, _, body = open(viaA, a.Path)
	wantCode("a revoked link through router A", status, body, 404, "link-not-found")

	// A lost node's link: 503 node-lost at once, without naming the node; back with its node.
	b := links["node-b"]
	nodes["node-b"].Kill()
	waitFor(t, 30*time.Second, "node-b's link to answer node-lost", func() bool {
		status, _, _ := open(viaB, b.Path)
		return status == http.StatusServiceUnavailable
	})
	status, h, body := open(viaA, b.Path)
	wantCode("node-b's link while node-b is down", status, body, 503, "node-lost")
	if h.Get("Retry-After") == "" || strings.Contains(string(body), "node-b") {
		t.Fatalf("node-lost for a link: Retry-After %q, body %s (the node must not be named)", h.Get("Retry-After"), body)
	}
	nodes["node-b"].start()
	waitFor(t, 60*time.Second, "node-b's link to work again", func() bool {
		status, _, _ := open(viaA, b.Path+"again")
		return status == http.StatusOK
	})
}
