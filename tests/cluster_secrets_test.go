package tests

import (
	"bytes"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/cluster/router"
	"github.com/bothy/bothy/egress"
	"github.com/bothy/bothy/sdk/go/bothy"
)

// TestClusterSecrets: secrets through a router (docs/cluster.md, "Secrets"). Real nodes, each
// in a network namespace of its own, and a real router. A secret created through the router
// is on every live node, which lists its name (never its value) in its BothyNode; a node
// started afterwards lacks it, and every sandbox binding it is placed on the nodes that hold
// it (the new node, the roomiest, would take them otherwise) and sees its placeholder, never
// the value; on the node with an uplink the egress proxy sends the value to allowed.test in
// the placeholder's place. A second create is refused and leaves the new node without it; a
// rotate through the router gives the new node the secret (the next request to allowed.test
// carries the new value), and sandboxes binding it may then land there; the list through
// the router shows the bindings of every node; a delete is refused while any node's sandbox
// binds it and deletes it from every node once none does; bothy's CLI, the Go SDK and E2B's
// secrets API through the router reach every node; a rotate that a SIGKILLed node missed
// says so, and its repeat reaches the node once it is back. No answer and no line of the
// router's or the nodes' logs holds a value.
func TestClusterSecrets(t *testing.T) {
	requireRoot(t)
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	const value, rotated, e2bValue = "sk-cluster-9b1f0c7e5d3a2468ace0", "sk-cluster-rotated-13579bdf2468", "sk-cluster-e2b-0f1e2d3c4b5a"
	const cliValue, sdkValue = "sk-cluster-cli-5e4d3c2b1a09f8e7", "sk-cluster-sdk-a1b2c3d4e5f60718"
	// Each node in a network namespace of its own, as on hosts of their own: sandboxes that
	// bind secrets have a network, and two nodes' networks cannot share one namespace.
	apiserver := strings.TrimPrefix(cp.URL, "https://")
	subnet := 150 + os.Getpid()%100
	var world *netWorld
	startNode := func(i int, name, slots string, more ...string) *daemon {
		hostIP := netip.AddrFrom4([4]byte{10, byte(subnet), byte(i), 1})
		addr := netip.AddrFrom4([4]byte{10, byte(subnet), byte(i), 2})
		ns := newScaleHost(t, i, hostIP, addr, apiserver)
		if len(more) > 0 {
			// This node's sandboxes reach the test's internet (allowed.test, over HTTPS with
			// the test's CA) through an uplink of its namespace.
			world = newNetWorldIn(t, ns)
		}
		return startClusterNode(t, cp, admin, name, withToken(nodeToken), inNetNS(ns),
			withArgs(append([]string{"--listen", addr.String() + ":0", "--cluster-max-sandboxes", slots, "--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"}, more...)...))
	}
	testCA, err := egress.LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "test-ca.pem")
	if err := os.WriteFile(caFile, testCA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*daemon{}
	nodes["sec-a"] = startNode(0, "sec-a", "20", append(netUplinkArgs(), "--egress-ca-file", caFile)...)
	nodes["sec-b"] = startNode(1, "sec-b", "20")
	allowed := serveTLSIn(t, world.inet, netAllowed, testCA)
	url, proc := startRouterProcess(t, cp, routerToken, nodeToken)
	rt := &daemon{t: t, URL: url, Token: routerToken}
	var answers [][]byte
	keep := func(r response) response { answers = append(answers, r.Body); return r }
	lists := func(name, secret string) bool {
		t.Helper()
		held := false
		waitObject(t, admin, name+"'s secrets", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
			held = slices.Contains(n.Status.Secrets, secret)
			return nil
		})
		return held
	}

	decode[secretJSON](t, keep(rt.doJSON("POST", "/v1/secrets", map[string]any{"name": "API_KEY", "value": value})), 201)
	for name, d := range nodes {
		decode[secretJSON](t, keep(d.doJSON("GET", "/v1/secrets/API_KEY", nil)), 200)
		waitCond(t, 30*time.Second, name+" listing API_KEY", func() (bool, error) { return lists(name, "API_KEY"), nil })
	}

	// A node that joins now lacks it: sandboxes binding it go to the nodes that hold it, though
	// the new node, empty, would take them by room.
	// It has twice the slots: by room alone it takes every create.
	nodes["sec-c"] = startNode(2, "sec-c", "40")
	waitRouterLive(t, rt, "sec-c")
	wantProblem(t, nodes["sec-c"].doJSON("GET", "/v1/secrets/API_KEY", nil), 404, "secret-not-found")
	policy := map[string]any{"allow": []string{"allowed.test"}, "secrets": map[string]any{
		"API_KEY": map[string]any{"hosts": []string{"allowed.test"}, "header": map[string]any{"name": "X-Api-Key", "value": "Key {value}"}}}}
	// send has sandbox id send a request to allowed.test with its placeholder, and checks that
	// the host got want in its place, and the sandbox the echo with its placeholder back.
	send := func(id, ph, want string) {
		t.Helper()
		r := rt.exec(id, map[string]any{"command": []string{"/usr/bin/python3", "-c", egressClient, "send", "https://allowed.test/"}, "timeout_ms": 30000})
		if r.ExitCode != 0 {
			t.Fatalf("%s's request to allowed.test: exit %d: %s", id, r.ExitCode, r.Stderr)
		}
		if got, w := allowed.last(t), fmt.Sprintf("auth=Bearer %s key=Key %s body=token=%s", want, want, want); got != w {
			t.Fatalf("allowed.test got %q from %s; want %q", got, id, w)
		}
		if strings.TrimSpace(r.Stdout) != "got auth=Bearer "+ph {
			t.Fatalf("%s got the answer %q; want the echo with its placeholder", id, r.Stdout)
		}
	}
	placeholder := func(id string) string {
		t.Helper()
		env := rt.exec(id, map[string]any{"command": []string{"env"}})
		if strings.Contains(env.Stdout, value) || strings.Contains(env.Stdout, rotated) {
			t.Fatalf("%s's environment holds the value", id)
		}
		for _, line := range strings.Split(env.Stdout, "\n") {
			if v, ok := strings.CutPrefix(line, "BOTHY_SECRET_API_KEY="); ok && strings.HasPrefix(v, "bothy-secret-") {
				return v
			}
		}
		t.Fatalf("%s's environment has no placeholder of API_KEY:\n%s", id, env.Stdout)
		return ""
	}
	seen := map[string]bool{}
	onA := ""
	for i := range 4 {
		id := fmt.Sprintf("binds-%d", i)
		if r := keep(rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true, "network": policy})); r.Status != 201 {
			t.Fatalf("create %s binding API_KEY: %d %s", id, r.Status, r.Body)
		}
		if r := nodes["sec-c"].doJSON("GET", "/v1/sandboxes/"+id, nil); r.Status != 404 {
			t.Fatalf("%s, which binds API_KEY, is on sec-c, which lacks it: %d %s", id, r.Status, r.Body)
		}
		p := placeholder(id)
		if seen[p] {
			t.Fatalf("%s has the placeholder of another sandbox", id)
		}
		seen[p] = true
		if onA == "" && nodes["sec-a"].doJSON("GET", "/v1/sandboxes/"+id, nil).Status == 200 {
			onA = id
		}
	}
	// The effect: sec-a's proxy puts the value in the placeholder's place on the way out.
	if onA == "" {
		t.Fatal("no sandbox binding API_KEY is on sec-a: placement did not spread them over the two holders")
	}
	send(onA, placeholder(onA), value)
	// Without secrets, the new node takes the next create (it has the most room): the rule
	// above is what kept the others off it.
	if r := rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "free-0"}); r.Status != 201 {
		t.Fatalf("create free-0: %d %s", r.Status, r.Body)
	}
	if r := nodes["sec-c"].doJSON("GET", "/v1/sandboxes/free-0", nil); r.Status != 200 {
		t.Fatalf("free-0 is not on sec-c, the emptiest node, so placement's spread does not show the secrets' rule: %d", r.Status)
	}

	// A second create is refused, and undone: sec-c still lacks it.
	p := wantProblem(t, keep(rt.doJSON("POST", "/v1/secrets", map[string]any{"name": "API_KEY", "value": value})), 409, "secret-exists")
	if !strings.Contains(p.Detail, "sec-c") {
		t.Fatalf("secret-exists does not name the node that lacks it: %s", p.Detail)
	}
	wantProblem(t, nodes["sec-c"].doJSON("GET", "/v1/secrets/API_KEY", nil), 404, "secret-not-found")

	// A rotate through the router gives sec-c the secret; a sandbox binding it may land there.
	decode[secretJSON](t, keep(rt.doJSON("POST", "/v1/secrets/API_KEY/rotate", map[string]any{"value": rotated})), 200)
	send(onA, placeholder(onA), rotated) // the next request carries the new value
	decode[secretJSON](t, keep(nodes["sec-c"].doJSON("GET", "/v1/secrets/API_KEY", nil)), 200)
	waitCond(t, 30*time.Second, "sec-c listing API_KEY", func() (bool, error) { return lists("sec-c", "API_KEY"), nil })
	if r := rt.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "binds-c", "start": true, "network": policy}); r.Status != 201 {
		t.Fatalf("create binds-c: %d %s", r.Status, r.Body)
	}
	if r := nodes["sec-c"].doJSON("GET", "/v1/sandboxes/binds-c", nil); r.Status != 200 {
		t.Fatalf("binds-c is not on sec-c, the emptiest node, which holds API_KEY now: %d", r.Status)
	}
	placeholder("binds-c")

	// bothy's CLI through the router: a rotate reaches every node (the next request carries
	// its value), the list shows the secret.
	if out := rt.ctlOK(cliValue+"\n", "secret", "rotate", "API_KEY", "--value-stdin"); !strings.Contains(out, "API_KEY") {
		t.Fatalf("bothy secret rotate through the router: %q", out)
	}
	send(onA, placeholder(onA), cliValue)
	if out := rt.ctlOK("", "secret", "ls"); !strings.Contains(out, "API_KEY") || strings.Contains(out, "sk-cluster") {
		t.Fatalf("bothy secret ls through the router: %q", out)
	}

	// The list shows the bindings of every node.
	list := decode[struct{ Items []secretJSON }](t, keep(rt.doJSON("GET", "/v1/secrets", nil)), 200)
	if len(list.Items) != 1 || list.Items[0].Name != "API_KEY" || list.Items[0].RotatedAt == nil || len(list.Items[0].Bindings) != 5 {
		t.Fatalf("the secrets through the router: %+v", list.Items)
	}

	// A delete is refused while any node's sandbox binds it, and deletes nothing.
	p = wantProblem(t, keep(rt.doJSON("DELETE", "/v1/secrets/API_KEY", nil)), 409, "secret-in-use")
	if !strings.Contains(p.Detail, "binds-0") || !strings.Contains(p.Detail, "binds-c") {
		t.Fatalf("secret-in-use does not name the sandboxes of every node: %s", p.Detail)
	}
	for name, d := range nodes {
		if r := d.doJSON("GET", "/v1/secrets/API_KEY", nil); r.Status != 200 {
			t.Fatalf("a refused delete deleted API_KEY on %s: %d", name, r.Status)
		}
	}
	for _, id := range []string{"binds-0", "binds-1", "binds-2", "binds-3", "binds-c"} {
		if r := rt.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	if r := keep(rt.doJSON("DELETE", "/v1/secrets/API_KEY", nil)); r.Status != 204 {
		t.Fatalf("delete API_KEY through the router: %d %s", r.Status, r.Body)
	}
	for name, d := range nodes {
		wantProblem(t, d.doJSON("GET", "/v1/secrets/API_KEY", nil), 404, "secret-not-found")
		waitCond(t, 30*time.Second, name+" no longer listing API_KEY", func() (bool, error) { return !lists(name, "API_KEY"), nil })
	}
	wantProblem(t, keep(rt.doJSON("GET", "/v1/secrets/API_KEY", nil)), 404, "secret-not-found")

	// The Go SDK through the router.
	sdk, err := bothy.New(url, bothy.WithToken(routerToken))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sdk.CreateSecret(ctx, "SDK_KEY", sdkValue); err != nil {
		t.Fatalf("the Go SDK's create through the router: %v", err)
	}
	for name, d := range nodes {
		if r := d.doJSON("GET", "/v1/secrets/SDK_KEY", nil); r.Status != 200 {
			t.Fatalf("the Go SDK's create did not reach %s: %d", name, r.Status)
		}
	}
	if s, err := sdk.RotateSecret(ctx, "SDK_KEY", sdkValue+"-2"); err != nil || s.RotatedAt == nil {
		t.Fatalf("the Go SDK's rotate through the router: %+v %v", s, err)
	}
	if all, err := sdk.Secrets(ctx); err != nil || len(all) != 1 || all[0].Name != "SDK_KEY" {
		t.Fatalf("the Go SDK's list through the router: %+v %v", all, err)
	}
	if err := sdk.DeleteSecret(ctx, "SDK_KEY"); err != nil {
		t.Fatalf("the Go SDK's delete through the router: %v", err)
	}
	if _, err := sdk.GetSecret(ctx, "SDK_KEY"); err == nil || !strings.Contains(err.Error(), "secret-not-found") {
		t.Fatalf("the Go SDK's read of a deleted secret through the router: %v", err)
	}

	// E2B's secrets API through the router.
	e2b := func(method, path, body string) response {
		var r *bytes.Reader
		if body != "" {
			r = bytes.NewReader([]byte(body))
		}
		h := http.Header{"X-Api-Key": {"e2b_" + routerToken}, "Content-Type": {"application/json"}}
		if r == nil {
			return keep(rt.do(method, path, nil, h))
		}
		return keep(rt.do(method, path, r, h))
	}
	if r := e2b("POST", "/secrets", `{"name":"E2B_Key","value":"`+e2bValue+`"}`); r.Status != 201 || !strings.Contains(string(r.Body), `"sec_e2b_key"`) {
		t.Fatalf("E2B create through the router: %d %s", r.Status, r.Body)
	}
	for name, d := range nodes {
		if r := d.doJSON("GET", "/v1/secrets/e2b_key", nil); r.Status != 200 {
			t.Fatalf("E2B's create did not reach %s: %d", name, r.Status)
		}
	}
	if r := e2b("GET", "/secrets", ""); r.Status != 200 || !strings.Contains(string(r.Body), `"e2b_key"`) {
		t.Fatalf("E2B list through the router: %d %s", r.Status, r.Body)
	}
	if r := e2b("DELETE", "/secrets/sec_e2b_key", ""); r.Status != 204 {
		t.Fatalf("E2B delete through the router: %d %s", r.Status, r.Body)
	}
	if r := e2b("GET", "/secrets/sec_e2b_key", ""); r.Status != 404 {
		t.Fatalf("E2B read of a deleted secret through the router: %d %s", r.Status, r.Body)
	}

	// What a write costs through the router (every node, at once) beside one node's own.
	cycle := func(d *daemon) time.Duration {
		t.Helper()
		const n = 10
		began := time.Now()
		for i := range n {
			name := fmt.Sprintf("TIMED_%d", i)
			if r := keep(d.doJSON("POST", "/v1/secrets", map[string]any{"name": name, "value": "sk-cluster-timed-0123456789"})); r.Status != 201 {
				t.Fatalf("create %s: %d %s", name, r.Status, r.Body)
			}
			if r := keep(d.doJSON("DELETE", "/v1/secrets/"+name, nil)); r.Status != 204 {
				t.Fatalf("delete %s: %d %s", name, r.Status, r.Body)
			}
		}
		return time.Since(began) / n
	}
	t.Logf("a secret's create and delete: %v through the router over %d nodes, %v on one node directly",
		cycle(rt).Round(time.Microsecond), len(nodes), cycle(nodes["sec-b"]).Round(time.Microsecond))

	// A node lost during a rotate keeps the older value: the rotate, done on the live nodes,
	// says so (503 node-lost naming it), and its repeat once the node is back reaches it.
	decode[secretJSON](t, keep(rt.doJSON("POST", "/v1/secrets", map[string]any{"name": "LOSS_KEY", "value": value})), 201)
	waitCond(t, 30*time.Second, "sec-b listing LOSS_KEY", func() (bool, error) { return lists("sec-b", "LOSS_KEY"), nil })
	nodes["sec-b"].Kill()
	waitCond(t, 30*time.Second, "sec-b's lease lapsed", func() (bool, error) {
		var l coordinationv1.Lease
		err := admin.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: node.LeaseName("sec-b")}, &l)
		if err != nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			return false, err
		}
		return !node.LeaseLive(l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, time.Now()), nil
	})
	p = wantProblem(t, keep(rt.doJSON("POST", "/v1/secrets/LOSS_KEY/rotate", map[string]any{"value": rotated})), 503, router.CodeNodeLost)
	if !strings.Contains(p.Detail, "sec-b") {
		t.Fatalf("node-lost does not name the lost node: %s", p.Detail)
	}
	nodes["sec-b"].start()
	// Until the restarted node publishes its new address the router may find it live at the
	// old one and say it did not answer (502): asked again until it answers 200.
	waitCond(t, 60*time.Second, "the rotate's repeat answered once sec-b is back", func() (bool, error) {
		status, body := routerCall(ctx, t, url, routerToken, "POST", "/v1/secrets/LOSS_KEY/rotate", map[string]any{"value": rotated})
		answers = append(answers, body)
		return status == 200, nil
	})
	if s := decode[secretJSON](t, keep(nodes["sec-b"].doJSON("GET", "/v1/secrets/LOSS_KEY", nil)), 200); s.RotatedAt == nil {
		t.Fatal("sec-b, back, did not get the repeated rotate")
	}

	for _, a := range answers {
		if bytes.Contains(a, []byte("sk-cluster")) {
			t.Errorf("an answer carries a value: %s", a)
		}
	}
	if strings.Contains(proc.logs.String(), "sk-cluster") {
		t.Error("the router's log carries a value")
	}
	for name, d := range nodes {
		if strings.Contains(d.logs.String(), "sk-cluster") {
			t.Errorf("%s's log carries a value", name)
		}
	}
}
