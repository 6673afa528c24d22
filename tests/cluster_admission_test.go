package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/internal/kubetest"
)

// startClusterNode starts a node bothyd for the cluster tests, authenticated as the node's
// service account, with the given extra flags, and waits for its BothyNode's status.
func startClusterNode(t testing.TB, cp *kubetest.ControlPlane, admin client.Client, name string, opts ...daemonOption) *daemon {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		t.Fatal(err)
	}
	opts = append([]daemonOption{withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig,
		"--cluster-node-name", name, "--cluster-lease-duration", "6s")}, opts...)
	d := startDaemon(t, opts...)
	waitObject(t, admin, name+" published", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if n.Status.Address == "" {
			return fmt.Errorf("status %+v", n.Status)
		}
		return nil
	})
	return d
}

// TestClusterNodeFull: a node enforces the capacity it publishes, atomically: twelve creates
// at once (REST) on a node with room for three by memory pass exactly three, the others
// answer 503 node-full with Retry-After; then the slots bind (creates not started hold a slot
// and no memory), a start of one that would pass the memory is refused, and an E2B create and
// a Sandbox object placed on the node are refused alike (the object says so in its status). The node's published allocation never passes its
// capacity.
func TestClusterNodeFull(t *testing.T) {
	requireRoot(t)
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser)
	const name = "full-a"
	d := startClusterNode(t, cp, admin, name, withArgs("--cluster-max-sandboxes", "5",
		"--cluster-memory-mb", "1000", "--cluster-cpu-overcommit", "100"))

	// Twelve started creates of 300 MiB at once: 1000 MiB hold three.
	var wg sync.WaitGroup
	answers := make([]response, 12)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": fmt.Sprintf("m-%d", i), "start": true, "resources": map[string]any{"memory_mb": 300}})
		}()
	}
	wg.Wait()
	created := 0
	for i, r := range answers {
		switch {
		case r.Status == 201:
			created++
		case r.Status == 503 && problemCode(r.Body) == "node-full" && r.Header.Get("Retry-After") != "":
		default:
			t.Fatalf("create m-%d: %d %s (Retry-After %q), want 201 or 503 node-full", i, r.Status, r.Body, r.Header.Get("Retry-After"))
		}
	}
	if created != 3 {
		t.Fatalf("%d of 12 concurrent creates of 300 MiB passed on a node of 1000 MiB, want 3", created)
	}
	// A fork makes started sandboxes of its source's limits: each is admitted as a create
	// is, so with 100 MiB free both forks of a 300 MiB sandbox are refused, and nothing made.
	var source string
	for i, r := range answers {
		if r.Status == 201 {
			source = fmt.Sprintf("m-%d", i)
			break
		}
	}
	fork := decode[forkJSON](t, d.doJSON("POST", "/v1/sandboxes/"+source+"/fork", map[string]any{"ids": []string{"f-0", "f-1"}}), 200)
	if len(fork.Items) != 2 {
		t.Fatalf("fork of %s: %+v", source, fork)
	}
	for _, it := range fork.Items {
		if it.Error == nil || it.Error.Code != "node-full" || it.Sandbox != nil {
			t.Fatalf("fork %s on a node with 100 MiB free: %+v, want node-full", it.ID, it)
		}
		if r := d.doJSON("GET", "/v1/sandboxes/"+it.ID, nil); r.Status != 404 {
			t.Fatalf("the refused fork %s exists: %d", it.ID, r.Status)
		}
	}
	// Slots: five in all; creates not started hold one each and no memory.
	for i := range 2 {
		if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": fmt.Sprintf("p-%d", i)}); r.Status != 201 {
			t.Fatalf("create p-%d with slots free: %d %s", i, r.Status, r.Body)
		}
	}
	r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "p-2", "resources": map[string]any{"memory_mb": 16}})
	if r.Status != 503 || problemCode(r.Body) != "node-full" || !strings.Contains(problemDetail(r.Body), "sandbox slots") {
		t.Fatalf("a sixth sandbox on a node of five slots: %d %s, want 503 node-full naming the slots", r.Status, r.Body)
	}
	// E2B's create is refused alike, in E2B's form.
	e2b := d.do("POST", "/sandboxes", bytes.NewReader([]byte(`{"templateID":"base"}`)), http.Header{"X-Api-Key": {"e2b_" + d.Token}, "Authorization": nil})
	if e2b.Status != 503 || !strings.Contains(string(e2b.Body), "node-full") {
		t.Fatalf("an E2B create on a full node: %d %s, want 503 node-full", e2b.Status, e2b.Body)
	}
	// A start of a sandbox that holds no memory now (provisioned) takes its limits: refused
	// alike with 900 of 1000 MiB allocated.
	if r := d.doJSON("POST", "/v1/sandboxes/p-1/start", nil); r.Status != 503 || problemCode(r.Body) != "node-full" {
		t.Fatalf("starting p-1 (512 MiB) with 100 MiB free: %d %s, want 503 node-full", r.Status, r.Body)
	}
	// A Sandbox object placed on the node (as the controller places one) is refused too,
	// and its status says why.
	obj := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: "obj-full",
		Labels:      map[string]string{v1alpha1.NodeLabel: name},
		Annotations: map[string]string{v1alpha1.PlacedAnnotation: name},
		Finalizers:  []string{v1alpha1.Finalizer}}, Spec: v1alpha1.SandboxSpec{NodeName: name, Resources: v1alpha1.Resources{MemoryMB: 64}}}
	if err := admin.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	waitObject(t, admin, "obj-full's refusal", client.ObjectKeyFromObject(obj), &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
		if !strings.Contains(s.Status.Message, "node-full") || s.Status.Node != "" {
			return fmt.Errorf("status %+v", s.Status)
		}
		return nil
	})
	// Room made: the object's retry (with backoff) makes its sandbox.
	if r := d.doJSON("DELETE", "/v1/sandboxes/p-0", nil); r.Status != 204 {
		t.Fatalf("delete p-0: %d %s", r.Status, r.Body)
	}
	waitObjectWithin(t, admin, 90*time.Second, "obj-full made once there is room", client.ObjectKeyFromObject(obj), &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
		if s.Status.Node != name || s.Status.State != v1alpha1.StateRunning {
			return fmt.Errorf("status %+v", s.Status)
		}
		return nil
	})
	waitObject(t, admin, "the node's allocation", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		a, c := n.Status.Allocated, n.Status.Capacity
		if a.Sandboxes != 5 || a.MemoryMB > c.MemoryMB || a.Sandboxes > c.Sandboxes || a.MilliCPU > c.MilliCPU {
			return fmt.Errorf("allocated %+v of %+v", a, c)
		}
		return nil
	})
}

// problemCode and problemDetail read a problem+json body's code and detail.
func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}

func problemDetail(body []byte) string {
	var p struct {
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Detail
}

// TestClusterNodeDrain: a node drained by its BothyNode's spec refuses creates
// (node-draining), lets a sandbox with a lifetime run out, deletes the one left at the
// operator's deadline (its object goes with it), and publishes how many remain, then
// drained; called off, it takes creates again. A cordoned node still takes a create sent to
// it (cordon is placement's).
func TestClusterNodeDrain(t *testing.T) {
	requireRoot(t)
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser)
	const name = "drain-a"
	d := startClusterNode(t, cp, admin, name)
	patchSpec := func(spec map[string]any) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"spec": spec})
		if err := admin.Patch(ctx, &v1alpha1.BothyNode{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch("application/merge-patch+json", b)); err != nil {
			t.Fatal(err)
		}
	}
	// Cordoned: the node itself still takes a create.
	patchSpec(map[string]any{"cordoned": true})
	waitObject(t, admin, "the cordon read", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if !n.Spec.Cordoned {
			return fmt.Errorf("spec %+v", n.Spec)
		}
		return nil
	})
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "short", "start": true, "timeout_s": 4, "on_timeout": "delete"}); r.Status != 201 {
		t.Fatalf("create on a cordoned node: %d %s", r.Status, r.Body)
	}
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "long", "start": true}); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	waitObject(t, admin, "long mirrored", client.ObjectKey{Namespace: config.Namespace, Name: "long"}, &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
		if s.Status.State != v1alpha1.StateRunning {
			return fmt.Errorf("state %q", s.Status.State)
		}
		return nil
	})

	// Drain with a deadline far enough for the short sandbox's lifetime to end first.
	deadline := metav1.NewTime(time.Now().Add(10 * time.Second).Truncate(time.Second))
	patchSpec(map[string]any{"cordoned": false, "draining": true, "drainDeadline": deadline.UTC().Format(time.RFC3339)})
	waitCond(t, 30*time.Second, "the node to refuse creates while draining", func() (bool, error) {
		r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "refused"})
		if r.Status == 201 {
			d.doJSON("DELETE", "/v1/sandboxes/refused", nil)
			return false, nil
		}
		if r.Status != 503 || problemCode(r.Body) != "node-draining" || r.Header.Get("Retry-After") == "" {
			return false, fmt.Errorf("a create while draining: %d %s", r.Status, r.Body)
		}
		return true, nil
	})
	// The short sandbox's lifetime ends it; the long one remains until the deadline.
	waitObject(t, admin, "one sandbox remaining", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if dr := n.Status.Drain; dr == nil || dr.Remaining != 1 || dr.Drained || dr.Deadline == nil || !dr.Deadline.Equal(&deadline) {
			return fmt.Errorf("drain status %+v", n.Status.Drain)
		}
		return nil
	})
	if time.Now().After(deadline.Time) {
		t.Fatalf("the short sandbox ran out only after the drain's deadline; the test's timing is too tight for this host")
	}
	if r := d.doJSON("GET", "/v1/sandboxes/long", nil); r.Status != 200 {
		t.Fatalf("long before the deadline: %d %s", r.Status, r.Body)
	}
	// At the deadline the node deletes what is left, and its object goes.
	waitObjectWithin(t, admin, 60*time.Second, "drained", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if dr := n.Status.Drain; dr == nil || dr.Remaining != 0 || !dr.Drained || dr.Deleted != 1 {
			return fmt.Errorf("drain status %+v", n.Status.Drain)
		}
		return nil
	})
	if time.Now().Before(deadline.Time) {
		t.Fatalf("drained before the deadline")
	}
	if r := d.doJSON("GET", "/v1/sandboxes/long", nil); r.Status != 404 {
		t.Fatalf("long after the deadline: %d %s, want 404", r.Status, r.Body)
	}
	waitGone(t, admin, client.ObjectKey{Namespace: config.Namespace, Name: "long"})
	if !strings.Contains(d.logs.String(), "the drain's deadline passed: deleted a sandbox") {
		t.Fatalf("the node's log does not say the drain deleted long")
	}
	// And the cluster's events say so, on the sandbox's object (kubectl describe sandbox long).
	var events corev1.EventList
	if err := admin.List(ctx, &events, client.InNamespace(config.Namespace)); err != nil {
		t.Fatal(err)
	}
	drained := 0
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "Sandbox" && e.InvolvedObject.Name == "long" && e.Reason == "Drained" && strings.Contains(e.Message, name) {
			drained++
		}
	}
	if drained != 1 {
		t.Fatalf("%d Drained events on long, want 1", drained)
	}

	// Called off: creates are taken again and the drain's status goes.
	patchSpec(map[string]any{"draining": false, "drainDeadline": nil})
	waitCond(t, 30*time.Second, "the node to take creates again", func() (bool, error) {
		r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "after"})
		return r.Status == 201, nil
	})
	waitObject(t, admin, "the drain's status gone", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if n.Status.Drain != nil {
			return fmt.Errorf("drain status %+v", n.Status.Drain)
		}
		return nil
	})
}

// TestClusterTwoRoutersNeverOvercommit: two routers, each with reservations of its own,
// place four creates each at once over two nodes of three slots: each router spreads its
// four 2 and 2, so the nodes are asked for four each. The nodes' own admission refuses the
// fourth (node-full), the router places it on the other node, which is full too: exactly six
// are made, three on each node, and the two others answer no-node-available. Without the
// nodes' admission all eight are made (four on each node).
func TestClusterTwoRoutersNeverOvercommit(t *testing.T) {
	requireRoot(t)
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	const nodeToken, routerToken, slots = "node-token-0123456789abcdef", "router-token-0123456789abcdef", 3
	nodes := map[string]*daemon{}
	for _, name := range []string{"two-a", "two-b"} {
		nodes[name] = startClusterNode(t, cp, admin, name, withToken(nodeToken), withArgs("--cluster-max-sandboxes", fmt.Sprint(slots),
			"--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	routers := []string{startRouter(t, cp, routerToken, nodeToken), startRouter(t, cp, routerToken, nodeToken)}
	// Each router must see both nodes before the burst, or it would place all on one.
	for _, url := range routers {
		waitCond(t, 30*time.Second, "a router listing both nodes", func() (bool, error) {
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/v1/sandboxes", nil)
			req.Header.Set("Authorization", "Bearer "+routerToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == 200, nil
		})
	}
	var wg sync.WaitGroup
	statuses := make([]int, 8)
	codes := make([]string, 8)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("two-%d", i), "start": true, "resources": map[string]any{"memory_mb": 64}})
			req, _ := http.NewRequestWithContext(ctx, "POST", routers[i%2]+"/v1/sandboxes", bytes.NewReader(b))
			req.Header.Set("Authorization", "Bearer "+routerToken)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Errorf("create two-%d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			statuses[i], codes[i] = resp.StatusCode, problemCode(body.Bytes())
		}()
	}
	wg.Wait()
	made := 0
	for i, s := range statuses {
		switch {
		case s == 201:
			made++
		case s == 503 && codes[i] == "no-node-available":
		default:
			t.Errorf("create two-%d: %d %s", i, s, codes[i])
		}
	}
	perNode := map[string]int{}
	for name, d := range nodes {
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		r := d.doJSON("GET", "/v1/sandboxes", nil)
		if r.Status != 200 || json.Unmarshal(r.Body, &list) != nil {
			t.Fatalf("list %s: %d %s", name, r.Status, r.Body)
		}
		perNode[name] = len(list.Items)
	}
	if made != 2*slots || perNode["two-a"] != slots || perNode["two-b"] != slots {
		t.Fatalf("%d of 8 creates made, %v per node: want %d, %d on each node", made, perNode, 2*slots, slots)
	}
}

// TestClusterIDClaimed: an id is the cluster's. Two creates of each of ten new ids sent at
// the same instant to two nodes (as two routers placing them at once would) make each
// sandbox once: one node answers 201, the other 409 already-provisioned naming the first,
// and the id's object names the node that holds it; a create that fails leaves no claim
// behind, and the cluster-wide check ends clean.
func TestClusterIDClaimed(t *testing.T) {
	requireRoot(t)
	cp, admin, _ := startInstalledCluster(t, 5*time.Minute, clusterNodeUser)
	const token = "node-token-0123456789abcdef"
	nodes := map[string]*daemon{}
	for _, name := range []string{"claim-a", "claim-b"} {
		nodes[name] = startClusterNode(t, cp, admin, name, withToken(token))
	}
	for i := range 10 {
		id := fmt.Sprintf("twice-%d", i)
		var wg sync.WaitGroup
		answers := map[string]response{}
		var mu sync.Mutex
		for name, d := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id})
				mu.Lock()
				answers[name] = r
				mu.Unlock()
			}()
		}
		wg.Wait()
		var won, lost string
		for name, r := range answers {
			switch {
			case r.Status == 201:
				won = name
			case r.Status == 409 && problemCode(r.Body) == "already-provisioned":
				lost = name
			default:
				t.Fatalf("create %s on %s: %d %s", id, name, r.Status, r.Body)
			}
		}
		if won == "" || lost == "" {
			t.Fatalf("%s created at once on both nodes: %v made it, %v refused it; want one each", id, won, lost)
		}
		if d := problemDetail(answers[lost].Body); !strings.Contains(d, won) {
			t.Fatalf("the refusal of %s does not name %s, which holds it: %s", id, won, d)
		}
		waitObject(t, admin, id+"'s object", client.ObjectKey{Namespace: config.Namespace, Name: id}, &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
			if s.Labels[v1alpha1.NodeLabel] != won || s.Status.Node != won {
				return fmt.Errorf("label %q, status node %q; want %s", s.Labels[v1alpha1.NodeLabel], s.Status.Node, won)
			}
			return nil
		})
	}
	// A create refused after its claim (an image no node has) leaves no object.
	if r := nodes["claim-a"].doJSON("POST", "/v1/sandboxes", map[string]any{"id": "no-image", "image": "nowhere"}); r.Status != 404 {
		t.Fatalf("a create of an image the node lacks: %d %s", r.Status, r.Body)
	}
	waitGone(t, admin, client.ObjectKey{Namespace: config.Namespace, Name: "no-image"})
	if r := nodes["claim-b"].doJSON("POST", "/v1/sandboxes", map[string]any{"id": "no-image"}); r.Status != 201 {
		t.Fatalf("the id of a failed create on another node: %d %s", r.Status, r.Body)
	}
}
