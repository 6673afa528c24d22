package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/sdk/go/bothy"
)

// routerEvent is one event of a router's stream, as the Go SDK reads it.
type routerEvent struct {
	id, key string // key: "<sandbox> <type>"
}

// followRouter reads the event stream of the router at url, from since, into a channel,
// with the Go SDK (which must take the router's ids as they are).
func followRouter(t *testing.T, ctx context.Context, url, token, since string) (<-chan routerEvent, context.CancelFunc) {
	t.Helper()
	c, err := bothy.New(url, bothy.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.Events(ctx, since)
	if err != nil {
		cancel()
		t.Fatalf("opening %s's event stream: %v", url, err)
	}
	out := make(chan routerEvent, 1024)
	go func() {
		defer close(out)
		defer stream.Close()
		for {
			ev, err := stream.Next()
			if err != nil {
				return
			}
			sb := ""
			if ev.Sandbox != nil {
				sb = string(*ev.Sandbox)
			}
			out <- routerEvent{id: stream.LastID, key: sb + " " + string(ev.Type)}
		}
	}()
	return out, cancel
}

// readUntil reads events from ch, keeping those of the test's sandboxes (prefix ev-), until
// every key of want has come; it fails on a duplicate or at the deadline.
func readUntil(t *testing.T, ch <-chan routerEvent, seen map[string]bool, want ...string) (last string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	missing := func() []string {
		var m []string
		for _, k := range want {
			if !seen[k] {
				m = append(m, k)
			}
		}
		return m
	}
	for len(missing()) > 0 {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("the stream ended waiting for %v", missing())
			}
			last = ev.id
			if !strings.HasPrefix(ev.key, "ev-") {
				continue
			}
			if seen[ev.key] {
				t.Fatalf("%s came twice", ev.key)
			}
			seen[ev.key] = true
		case <-deadline:
			t.Fatalf("timed out waiting for the events %v", missing())
		}
	}
	return last
}

// TestClusterEvents: /v1/events through two real routers over real nodes. A stream through
// router A gets the events of a node that joins after it opened, goes on with the other node's
// while a node is SIGKILLed, and picks the node up again once it is back; the client closes
// it in the middle of a burst and resumes through router B with the last id it saw: it gets
// exactly the rest, none missed and none twice. The list through a router shows the killed
// node's sandbox node-lost meanwhile.
func TestClusterEvents(t *testing.T) {
	cp, admin, ctx := startInstalledCluster(t, 8*time.Minute, clusterNodeUser, clusterRouterUser)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		t.Fatal(err)
	}
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	startNode := func(name string) *daemon {
		d := startDaemon(t, withToken(nodeToken), withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig,
			"--cluster-node-name", name, "--cluster-lease-duration", "6s"))
		return d
	}
	published := func(name string, d *daemon) {
		t.Helper()
		waitObject(t, admin, name+" published", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
			if n.Status.Address != d.URL {
				return fmt.Errorf("address %q, want %q", n.Status.Address, d.URL)
			}
			return nil
		})
	}
	create := func(d *daemon, id string) {
		t.Helper()
		if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true}); r.Status != 201 {
			t.Fatalf("create %s: %d %s", id, r.Status, r.Body)
		}
	}
	made := func(ids ...string) []string {
		var keys []string
		for _, id := range ids {
			keys = append(keys, id+" sandbox.created", id+" sandbox.started")
		}
		return keys
	}

	a := startNode("node-a")
	published("node-a", a)
	routerA := startRouter(t, cp, routerToken, nodeToken)
	routerB := startRouter(t, cp, routerToken, nodeToken)

	// The stream opens before anything happens; node-b joins later.
	s1, close1 := followRouter(t, ctx, routerA, routerToken, "")
	seen := map[string]bool{}
	create(a, "ev-a1")
	readUntil(t, s1, seen, made("ev-a1")...)
	b := startNode("node-b")
	published("node-b", b)
	// The router follows a node from its first event on; the create may come before the
	// router has found node-b, and its events still come, from what node-b keeps.
	create(b, "ev-b1")
	readUntil(t, s1, seen, made("ev-b1")...)

	// node-a lost: the stream goes on with node-b's events; the list shows ev-a1 node-lost.
	a.Kill()
	create(b, "ev-b2")
	readUntil(t, s1, seen, made("ev-b2")...)
	waitCond(t, 30*time.Second, "ev-a1 listed node-lost through router B", func() (bool, error) {
		r := (&daemon{t: t, URL: routerB, Token: routerToken}).doJSON("GET", "/v1/sandboxes?state=node-lost", nil)
		var page struct {
			Items []struct{ ID, State string }
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &page) != nil {
			return false, fmt.Errorf("the list: %d %s", r.Status, r.Body)
		}
		return len(page.Items) == 1 && page.Items[0].ID == "ev-a1" && page.Items[0].State == "node-lost", nil
	})
	// Back: the router follows it again, from the events the restarted node keeps.
	a.start()
	published("node-a", a)
	create(a, "ev-a2")
	readUntil(t, s1, seen, made("ev-a2")...)

	// A burst on both nodes; the client reads one event of it through router A and goes.
	create(a, "ev-a3")
	create(b, "ev-b3")
	var last string
	for before := len(seen); len(seen) == before; {
		select {
		case ev, ok := <-s1:
			if !ok {
				t.Fatal("router A's stream ended")
			}
			last = ev.id
			if strings.HasPrefix(ev.key, "ev-") {
				if seen[ev.key] {
					t.Fatalf("%s came twice", ev.key)
				}
				seen[ev.key] = true
			}
		case <-time.After(60 * time.Second):
			t.Fatal("no event of the burst through router A")
		}
	}
	close1()
	t.Logf("resuming through router B after %d events, with the id %s", len(seen), last)
	// More while the client is away.
	create(a, "ev-a4")
	create(b, "ev-b4")

	s2, close2 := followRouter(t, ctx, routerB, routerToken, last)
	defer close2()
	readUntil(t, s2, seen, made("ev-a3", "ev-b3", "ev-a4", "ev-b4")...)
	// Nothing owed is left, and nothing seen comes again: the next events are new ones.
	create(b, "ev-b5")
	readUntil(t, s2, seen, made("ev-b5")...)
}
