package tests

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestClusterE2BSnapshots: E2B's snapshots through a real router in front of two real nodes
// without a template registry (docs/cluster.md, "E2B's API through the router"). A snapshot of
// a sandbox made through the router is made on the sandbox's node; the router lists it (the
// merge of both nodes' lists); a sandbox created from it at once, before the node's
// BothyNode lists the snapshot, is placed on that node (the other, emptier node cannot clone
// it) and has the source's files; a delete through the router removes it and the list no
// longer shows it. Without the routing every one of these answered 501.
func TestClusterE2BSnapshots(t *testing.T) {
	requireRoot(t)
	cp, admin, _ := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	nodes := map[string]*daemon{}
	for _, name := range []string{"snap-a", "snap-b"} {
		nodes[name] = startClusterNode(t, cp, admin, name, withToken(nodeToken),
			withArgs("--cluster-max-sandboxes", "10", "--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	rt := &daemon{t: t, URL: startRouter(t, cp, routerToken, nodeToken), Token: routerToken}
	key := http.Header{"X-API-KEY": {"e2b_" + routerToken}}
	e2b := func(method, path string, body any) response {
		t.Helper()
		var r *bytes.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			r = bytes.NewReader(b)
			return rt.do(method, path, r, key)
		}
		return rt.do(method, path, nil, key)
	}
	on := func(id string) string {
		t.Helper()
		var holders []string
		for name, d := range nodes {
			if r := d.doJSON("GET", "/v1/sandboxes/"+id, nil); r.Status == 200 {
				holders = append(holders, name)
			}
		}
		if len(holders) != 1 {
			t.Fatalf("%s is on %v, want one node", id, holders)
		}
		return holders[0]
	}
	type created struct {
		SandboxID string `json:"sandboxID"`
	}
	listed := func(query string) []string {
		t.Helper()
		var out []string
		for _, s := range decode[[]struct {
			SnapshotID string `json:"snapshotID"`
		}](t, e2b("GET", "/snapshots"+query, nil), 200) {
			out = append(out, s.SnapshotID)
		}
		return out
	}

	src := decode[created](t, e2b("POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 300}), 201).SandboxID
	t.Cleanup(func() { e2b("DELETE", "/sandboxes/"+src, nil) })
	home := on(src)
	if got := nodes[home].exec(src, map[string]any{"user": "root", "command": []string{"sh", "-c", "echo before > /opt/state.txt"}}); got.ExitCode != 0 {
		t.Fatalf("writing the source's file: %+v", got)
	}
	snap := decode[struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
	}](t, e2b("POST", "/sandboxes/"+src+"/snapshots", map[string]any{"name": "flow"}), 201)
	if !slices.Equal(snap.Names, []string{"flow"}) {
		t.Fatalf("the snapshot's names %v, want [flow]", snap.Names)
	}
	for name, d := range nodes {
		if r := d.doJSON("GET", "/v1/templates/"+snap.SnapshotID, nil); (r.Status == 200) != (name == home) {
			t.Fatalf("the snapshot's template on %s (the sandbox is on %s): %d %s", name, home, r.Status, r.Body)
		}
	}

	// At once: the router placed the snapshot's generation on its node before the BothyNode
	// lists it, and the other node (with more room: the source runs here) cannot clone it.
	from := decode[created](t, e2b("POST", "/sandboxes", map[string]any{"templateID": snap.SnapshotID, "timeout": 300}), 201).SandboxID
	t.Cleanup(func() { e2b("DELETE", "/sandboxes/"+from, nil) })
	if got := on(from); got != home {
		t.Fatalf("the sandbox created from the snapshot went to %s, the snapshot is on %s", got, home)
	}
	if got := nodes[home].exec(from, map[string]any{"command": []string{"cat", "/opt/state.txt"}}); got.ExitCode != 0 || got.Stdout != "before\n" {
		t.Fatalf("the source's file in the sandbox made from the snapshot: %+v", got)
	}

	if got := listed("?sandboxID=" + src); !slices.Equal(got, []string{snap.SnapshotID}) {
		t.Fatalf("the snapshots of %s through the router: %v, want [%s]", src, got, snap.SnapshotID)
	}
	if got := listed(""); !slices.Contains(got, snap.SnapshotID) {
		t.Fatalf("the snapshots through the router: %v, want %s among them", got, snap.SnapshotID)
	}

	if r := e2b("DELETE", "/sandboxes/"+from, nil); r.Status != 204 {
		t.Fatalf("kill the sandbox made from the snapshot: %d %s", r.Status, r.Body)
	}
	if r := e2b("DELETE", "/templates/"+snap.SnapshotID, nil); r.Status != 204 {
		t.Fatalf("delete the snapshot through the router: %d %s", r.Status, r.Body)
	}
	if got := listed("?sandboxID=" + src); len(got) != 0 {
		t.Fatalf("the snapshots of %s after the delete: %v, want none", src, got)
	}
	if r := e2b("DELETE", "/templates/"+snap.SnapshotID, nil); r.Status != 404 {
		t.Fatalf("a second delete through the router: %d %s, want 404", r.Status, r.Body)
	}
}
