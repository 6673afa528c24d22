package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/internal/kubetest"
)

// clusterNodeUser is the user a node's bothyd authenticates as: the service account the
// generated RBAC binds, so the test exercises exactly the rules a node is given.
const clusterNodeUser = "system:serviceaccount:bothy-system:bothy-node"

// TestClusterNode runs a real bothyd in node mode against a real kube-apiserver: a sandbox
// made through the node's REST API appears as a Sandbox object naming the node and following
// its state; the node's Lease is held, and lapses after a SIGKILL; the restarted node takes
// it back and reconciles the objects changed while it was down.
func TestClusterNode(t *testing.T) {
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		t.Fatal(err)
	}
	const name, leaseDuration = "node-a", 6 * time.Second
	d := startDaemon(t, withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig,
		"--cluster-node-name", name, "--cluster-lease-duration", leaseDuration.String(),
		"--cluster-max-sandboxes", "50"))

	// The node publishes itself: its address, capacity and health.
	waitObject(t, admin, "the BothyNode's status", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if n.Status.Address != d.URL || n.Status.Health != v1alpha1.NodeHealthy || n.Status.Capacity.Sandboxes != 50 || n.Status.Capacity.MemoryMB == 0 {
			return fmt.Errorf("status %+v", n.Status)
		}
		return nil
	})
	leaseLive := func() (bool, error) {
		var l coordinationv1.Lease
		if err := admin.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: node.LeaseName(name)}, &l); err != nil {
			// The node takes its lease only once its status is published, which is
			// what the wait above saw: the lease may follow a moment later.
			return false, client.IgnoreNotFound(err)
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != name || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			return false, nil
		}
		return node.LeaseLive(l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, time.Now()), nil
	}
	waitCond(t, 30*time.Second, "the node's lease held", func() (bool, error) { return leaseLive() })

	// A sandbox made through the node's API is mirrored, and follows its state.
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "kube-1", "start": true, "resources": map[string]any{"memory_mb": 256}}); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	sandbox := func(id string, state v1alpha1.SandboxState) func(*v1alpha1.Sandbox) error {
		return func(s *v1alpha1.Sandbox) error {
			if s.Status.Node != name || s.Status.State != state || s.Labels[v1alpha1.NodeLabel] != name {
				return fmt.Errorf("%s: node %q state %q label %q, want %s and %s", id, s.Status.Node, s.Status.State, s.Labels[v1alpha1.NodeLabel], name, state)
			}
			return nil
		}
	}
	key := func(id string) client.ObjectKey { return client.ObjectKey{Namespace: config.Namespace, Name: id} }
	waitObject(t, admin, "kube-1 running", key("kube-1"), &v1alpha1.Sandbox{}, sandbox("kube-1", v1alpha1.StateRunning))
	var obj v1alpha1.Sandbox
	if err := admin.Get(ctx, key("kube-1"), &obj); err != nil || obj.Spec.Resources.MemoryMB != 256 {
		t.Fatalf("kube-1's spec: memory %d, %v; want the create's 256", obj.Spec.Resources.MemoryMB, err)
	}
	// Its memory is allocated in the node's status.
	waitObject(t, admin, "the node's allocation", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if n.Status.Allocated.MemoryMB != 256 || n.Status.Sandboxes != 1 || n.Status.Free.Sandboxes != 49 {
			return fmt.Errorf("allocated %+v, %d sandboxes, free %+v", n.Status.Allocated, n.Status.Sandboxes, n.Status.Free)
		}
		return nil
	})
	if r := d.doJSON("POST", "/v1/sandboxes/kube-1/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	waitObject(t, admin, "kube-1 stopped", key("kube-1"), &v1alpha1.Sandbox{}, sandbox("kube-1", v1alpha1.StateStopped))
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "kube-2"}); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	waitObject(t, admin, "kube-2 provisioned", key("kube-2"), &v1alpha1.Sandbox{}, sandbox("kube-2", v1alpha1.StateProvisioned))
	if r := d.doJSON("DELETE", "/v1/sandboxes/kube-2", nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	waitGone(t, admin, key("kube-2"))

	// An id Kubernetes cannot name (bothy allows a trailing '-') gets no object: the node
	// says so once and goes on.
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "edge-"}); r.Status != 201 {
		t.Fatalf("create edge-: %d %s", r.Status, r.Body)
	}
	waitFor(t, 30*time.Second, "the node's word that edge- has no object", func() bool {
		return strings.Contains(d.logs.String(), "the API server refuses this sandbox's object")
	})
	if r := d.doJSON("DELETE", "/v1/sandboxes/edge-", nil); r.Status != 204 {
		t.Fatalf("delete edge-: %d %s", r.Status, r.Body)
	}

	// The lease names the process that renews it, the one the status names (a router reads
	// the node live only when they agree).
	startID := func() (lease, status string, err error) {
		var l coordinationv1.Lease
		if err := admin.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: node.LeaseName(name)}, &l); err != nil {
			return "", "", err
		}
		var n v1alpha1.BothyNode
		if err := admin.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return "", "", err
		}
		return l.Labels[node.StartLabel], n.Status.StartID, nil
	}
	var firstStart string
	waitCond(t, 30*time.Second, "the lease's start id to be the status's", func() (bool, error) {
		l, s, err := startID()
		firstStart = s
		return l != "" && l == s, err
	})

	// SIGKILL: nothing renews the lease, which lapses by the observer's clock.
	killed := time.Now()
	d.Kill()
	waitCond(t, 3*leaseDuration, "the killed node's lease to lapse", func() (bool, error) {
		live, err := leaseLive()
		return !live, err
	})
	t.Logf("the lease lapsed %v after the SIGKILL (lease duration %v)", time.Since(killed).Round(time.Millisecond), leaseDuration)

	// While the node is down its objects drift: kube-1's is lost (its finalizer forced off
	// and the object deleted: a plain delete would ask for the sandbox's delete, see
	// TestClusterSandboxApply), and an object of this node's names a sandbox it never had.
	var lost v1alpha1.Sandbox
	if err := admin.Get(ctx, key("kube-1"), &lost); err != nil {
		t.Fatal(err)
	}
	lost.Finalizers = nil
	if err := admin.Update(ctx, &lost); err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(ctx, &lost); err != nil {
		t.Fatal(err)
	}
	ghost := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: "ghost", Labels: map[string]string{v1alpha1.NodeLabel: name}}}
	if err := admin.Create(ctx, ghost); err != nil {
		t.Fatal(err)
	}
	// Another node's object is not this node's to remove.
	other := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: "elsewhere", Labels: map[string]string{v1alpha1.NodeLabel: "node-b"}}}
	if err := admin.Create(ctx, other); err != nil {
		t.Fatal(err)
	}

	d.start()
	waitCond(t, 30*time.Second, "the restarted node's lease", func() (bool, error) { return leaseLive() })
	waitObject(t, admin, "kube-1 remade by the reconcile", key("kube-1"), &v1alpha1.Sandbox{}, sandbox("kube-1", v1alpha1.StateStopped))
	waitGone(t, admin, key("ghost"))
	if err := admin.Get(ctx, key("elsewhere"), &v1alpha1.Sandbox{}); err != nil {
		t.Fatalf("another node's object after the reconcile: %v", err)
	}
	waitObject(t, admin, "the restarted node's address", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if n.Status.Address != d.URL || n.Status.Sandboxes != 1 {
			return fmt.Errorf("address %s, %d sandboxes; want %s and 1", n.Status.Address, n.Status.Sandboxes, d.URL)
		}
		return nil
	})
	// The restarted process names itself anew, in its status and its lease alike.
	l, st, err := startID()
	if err != nil || l != st || st == "" || st == firstStart {
		t.Fatalf("after the restart: the lease's start id %q, the status's %q (before it %q), %v; want one new id in both", l, st, firstStart, err)
	}
}

// waitObject waits until the object at key exists and check accepts it.
func waitObject[T client.Object](t testing.TB, c client.Client, what string, key client.ObjectKey, obj T, check func(T) error) {
	t.Helper()
	waitObjectWithin(t, c, 30*time.Second, what, key, obj, check)
}

// waitGone waits until no Sandbox object is at key.
func waitGone(t *testing.T, c client.Client, key client.ObjectKey) {
	t.Helper()
	waitCond(t, 30*time.Second, key.Name+"'s object removed", func() (bool, error) {
		err := c.Get(context.Background(), key, &v1alpha1.Sandbox{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// clusterRouterUser is the router's service account, held to the generated read-only RBAC.
const clusterRouterUser = "system:serviceaccount:bothy-system:bothy-router"

// startInstalledCluster starts a control plane whose users are users, installs the
// cluster's CRDs and RBAC into it, and returns it with an admin client and a context that
// ends after timeout (or with the test).
func startInstalledCluster(t testing.TB, timeout time.Duration, users ...string) (*kubetest.ControlPlane, client.Client, context.Context) {
	t.Helper()
	cp := kubetest.Start(t, kubetest.Options{Users: users})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	admin, err := node.NewClient(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := config.Install(ctx, admin); err != nil {
		t.Fatal(err)
	}
	return cp, admin, ctx
}

// startRouter starts `bothyd router` against the control plane and returns its URL.
func startRouter(t testing.TB, cp *kubetest.ControlPlane, token, nodeToken string) string {
	t.Helper()
	url, _ := startRouterProcess(t, cp, token, nodeToken)
	return url
}

// startRouterProcess is startRouter that also returns the router's process, for a test that
// kills it.
func startRouterProcess(t testing.TB, cp *kubetest.ControlPlane, token, nodeToken string) (string, *clusterProcess) {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterRouterUser); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"token": token, "node-token": nodeToken}
	for name, v := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bothydBin, "router", "--listen", "127.0.0.1:0", "--log-format", "json",
		"--token-file", filepath.Join(dir, "token"), "--node-token-file", filepath.Join(dir, "node-token"),
		"--cluster-kubeconfig", kubeconfig)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &clusterProcess{cmd: cmd, done: make(chan error, 1), logs: &lineLog{}}
	addr := make(chan string, 1)
	go p.logs.consume(stderr, addr)
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
		if t.Failed() {
			t.Logf("router log:\n%s", p.logs.String())
		}
	})
	select {
	case a := <-addr:
		return "http://" + a, p
	case err := <-p.done:
		p.done <- err // for the cleanup
		t.Fatalf("the router exited before serving: %v\n%s", err, p.logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the router did not serve within 30 s\n%s", p.logs.String())
	}
	return "", nil
}

// TestClusterRouter: two real node bothyds and a real router. Creates through the router,
// six at once, fill both nodes exactly to their slots (placement with reservations), a
// seventh finds no node; calls on each sandbox (a read, an exec) reach its node through the
// router; a sandbox on a node whose lease lapsed answers 503 node-lost.
func TestClusterRouter(t *testing.T) {
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterRouterUser)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		t.Fatal(err)
	}
	const nodeToken, routerToken, slots = "node-token-0123456789abcdef", "router-token-0123456789abcdef", 3
	nodes := map[string]*daemon{}
	for _, name := range []string{"node-a", "node-b"} {
		nodes[name] = startDaemon(t, withToken(nodeToken), withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig,
			"--cluster-node-name", name, "--cluster-lease-duration", "6s", "--cluster-max-sandboxes", fmt.Sprint(slots),
			// Memory and CPU to spare: the slots alone decide, so the spread is exact.
			"--cluster-memory-mb", "65536", "--cluster-cpu-overcommit", "100"))
	}
	for name, d := range nodes {
		waitObject(t, admin, name+" published", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
			if n.Status.Address != d.URL || n.Status.Free.Sandboxes != slots {
				return fmt.Errorf("status %+v", n.Status)
			}
			return nil
		})
	}
	url := startRouter(t, cp, routerToken, nodeToken)
	call := func(method, path string, body any) (int, []byte) {
		t.Helper()
		return routerCall(ctx, t, url, routerToken, method, path, body)
	}
	if status, _ := call("GET", "/v1/sandboxes/nobody", nil); status != 404 {
		t.Fatalf("a sandbox on no node: %d, want 404", status)
	}

	// Six creates at once: no node's status changes in between, so only the reservations keep
	// a node from taking more than its slots.
	var wg sync.WaitGroup
	statuses := make([]int, 2*slots)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _ = call("POST", "/v1/sandboxes", map[string]any{"id": fmt.Sprintf("r-%d", i), "start": true, "resources": map[string]any{"memory_mb": 128}})
		}()
	}
	wg.Wait()
	for i, s := range statuses {
		if s != 201 {
			t.Fatalf("create r-%d through the router: %d", i, s)
		}
	}
	status, body := call("POST", "/v1/sandboxes", map[string]any{"id": "r-extra"})
	if status != 503 || !strings.Contains(string(body), `"no-node-available"`) {
		t.Fatalf("a create with every slot taken: %d %s, want 503 no-node-available", status, body)
	}
	perNode := map[string][]string{}
	for i := range statuses {
		id := fmt.Sprintf("r-%d", i)
		var obj v1alpha1.Sandbox
		waitObject(t, admin, id+" mirrored", client.ObjectKey{Namespace: config.Namespace, Name: id}, &obj, func(s *v1alpha1.Sandbox) error {
			if s.Status.State != v1alpha1.StateRunning {
				return fmt.Errorf("state %q", s.Status.State)
			}
			return nil
		})
		perNode[obj.Status.Node] = append(perNode[obj.Status.Node], id)
		// A read and an exec through the router reach the sandbox's node.
		if status, body := call("GET", "/v1/sandboxes/"+id, nil); status != 200 || !strings.Contains(string(body), `"id":"`+id+`"`) {
			t.Fatalf("GET %s through the router: %d %s", id, status, body)
		}
		status, body := call("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"echo", id}})
		var ex execJSON
		if status != 200 || json.Unmarshal(body, &ex) != nil || ex.Stdout != id+"\n" {
			t.Fatalf("exec in %s through the router: %d %s", id, status, body)
		}
	}
	t.Logf("spread: %v", perNode)
	// The list spans the cluster, in id order, page by page as one node's would.
	var listed []string
	cursor := ""
	for pages := 0; ; pages++ {
		path := "/v1/sandboxes?limit=4"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		status, body := call("GET", path, nil)
		var page struct {
			Items []struct {
				ID string `json:"id"`
			} `json:"items"`
			NextCursor string `json:"next_cursor"`
		}
		if status != 200 || json.Unmarshal(body, &page) != nil || pages > 3 {
			t.Fatalf("listing through the router: %d %s", status, body)
		}
		for _, it := range page.Items {
			listed = append(listed, it.ID)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if want := []string{"r-0", "r-1", "r-2", "r-3", "r-4", "r-5"}; !slices.Equal(listed, want) {
		t.Fatalf("listed %v through the router, want %v", listed, want)
	}
	if len(perNode["node-a"]) != slots || len(perNode["node-b"]) != slots {
		t.Fatalf("spread %v: want %d on each node", perNode, slots)
	}
	// A node's own problem reaches the client as the node gave it.
	status, body = call("POST", "/v1/sandboxes/"+perNode["node-a"][0]+"/start", nil)
	if status != 409 || !strings.Contains(string(body), `"already-running"`) {
		t.Fatalf("starting a running sandbox through the router: %d %s, want the node's 409 already-running", status, body)
	}

	// The exec websocket through the router, both ways, on a sandbox of each node.
	viaRouter := &daemon{t: t, URL: url, Token: routerToken}
	for _, n := range []string{"node-a", "node-b"} {
		ws, _, err := viaRouter.dialStream(perNode[n][0], neturl.Values{"command": {"sh"}})
		if err != nil {
			t.Fatalf("the exec websocket through the router to %s: %v", n, err)
		}
		ws.send("echo via $((6*7))\n")
		ws.readUntil("via 42\n")
		ws.send("exit 3\n")
		if exit := ws.wait(); exit.ExitCode != 3 {
			t.Fatalf("the exec websocket through the router to %s: exit %+v", n, exit)
		}
	}

	// node-a lost: its sandboxes answer 503 node-lost, not a hang; node-b's still serve.
	nodes["node-a"].Kill()
	lost := perNode["node-a"][0]
	waitCond(t, 30*time.Second, "node-a's sandbox to read node-lost", func() (bool, error) {
		status, body := call("GET", "/v1/sandboxes/"+lost, nil)
		return status == 503 && strings.Contains(string(body), `"node-lost"`), nil
	})
	if status, _ := call("GET", "/v1/sandboxes/"+perNode["node-b"][0], nil); status != 200 {
		t.Fatalf("node-b's sandbox with node-a lost: %d", status)
	}
}

// clusterControllerUser is the controller's service account, held to its generated role.
const clusterControllerUser = "system:serviceaccount:bothy-system:bothy-controller"

// clusterProcess is a `bothyd controller` the test started.
type clusterProcess struct {
	cmd  *exec.Cmd
	done chan error
	logs *lineLog
}

func startController(t *testing.T, cp *kubetest.ControlPlane, identity string) *clusterProcess {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterControllerUser); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bothydBin, "controller", "--cluster-kubeconfig", kubeconfig, "--identity", identity,
		"--lease-duration", "6s", "--log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &clusterProcess{cmd: cmd, done: make(chan error, 1), logs: &lineLog{}}
	go p.logs.consume(stderr, make(chan string, 1))
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
		if t.Failed() {
			t.Logf("controller %s log:\n%s", identity, p.logs.String())
		}
	})
	return p
}

// TestClusterNodeLost: a node SIGKILLed reads node-lost in the objects within its lease time,
// even with the leading controller SIGKILLed at the same moment (the other replica takes
// over), and its sandbox reads running again, reattached, once the node is back.
func TestClusterNodeLost(t *testing.T) {
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterControllerUser)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		t.Fatal(err)
	}
	const name = "node-a"
	d := startDaemon(t, withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig,
		"--cluster-node-name", name, "--cluster-lease-duration", "6s"))
	controllers := map[string]*clusterProcess{}
	for _, id := range []string{"ctl-1", "ctl-2"} {
		controllers[id] = startController(t, cp, id)
	}
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "lost-1", "start": true}); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	key := client.ObjectKey{Namespace: config.Namespace, Name: "lost-1"}
	state := func(want v1alpha1.SandboxState) func(*v1alpha1.Sandbox) error {
		return func(s *v1alpha1.Sandbox) error {
			if s.Status.State != want {
				return fmt.Errorf("state %q, want %q", s.Status.State, want)
			}
			return nil
		}
	}
	waitObject(t, admin, "lost-1 running", key, &v1alpha1.Sandbox{}, state(v1alpha1.StateRunning))

	var leader string
	waitCond(t, 30*time.Second, "a controller leading", func() (bool, error) {
		var l coordinationv1.Lease
		err := admin.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: "bothy-controller"}, &l)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if l.Spec.HolderIdentity != nil && controllers[*l.Spec.HolderIdentity] != nil {
			leader = *l.Spec.HolderIdentity
		}
		return leader != "", nil
	})
	// The leader and the node die together.
	_ = controllers[leader].cmd.Process.Kill()
	killed := time.Now()
	d.Kill()
	// Within the node's lease (6 s), the other controller's takeover (at most its 6 s lease)
	// and a look (0.8 s), with room for a loaded machine.
	waitObjectWithin(t, admin, 60*time.Second, "lost-1 node-lost", key, &v1alpha1.Sandbox{}, state(v1alpha1.StateNodeLost))
	t.Logf("lost-1 read node-lost %v after the node's and the leading controller's SIGKILL", time.Since(killed).Round(time.Millisecond))
	var l coordinationv1.Lease
	if err := admin.Get(ctx, client.ObjectKey{Namespace: config.Namespace, Name: "bothy-controller"}, &l); err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == leader {
		t.Fatalf("the controller lease is held by %v after %s was killed", l.Spec.HolderIdentity, leader)
	}

	// The node comes back: it reattaches the sandbox, which ran on, and writes it running.
	restarted := time.Now()
	d.start()
	waitObjectWithin(t, admin, 60*time.Second, "lost-1 running again", key, &v1alpha1.Sandbox{}, state(v1alpha1.StateRunning))
	t.Logf("lost-1 read running %v after the node's restart began", time.Since(restarted).Round(time.Millisecond))
	// The sandbox ran on while its bothyd was down: an exec answers.
	if r := d.doJSON("POST", "/v1/sandboxes/lost-1/exec", map[string]any{"command": []string{"true"}}); r.Status != 200 {
		t.Fatalf("exec in lost-1 after the node's restart: %d %s", r.Status, r.Body)
	}
}

// waitObjectWithin is waitObject with a deadline of its own.
func waitObjectWithin[T client.Object](t testing.TB, c client.Client, timeout time.Duration, what string, key client.ObjectKey, obj T, check func(T) error) {
	t.Helper()
	last := errors.New("not found")
	deadline := time.Now().Add(timeout)
	for {
		err := c.Get(context.Background(), key, obj)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			t.Fatalf("waiting for %s: %v", what, err)
		default:
			if last = check(obj); last == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last: %v", timeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BenchmarkClusterRouter measures what the router adds to a call: a create and delete (not
// started), and a buffered exec, each straight to a node and through the router.
//
//	go test -run '^$' -bench BenchmarkClusterRouter -benchtime 100x ./tests
func BenchmarkClusterRouter(b *testing.B) {
	cp, admin, ctx := startInstalledCluster(b, 10*time.Minute, clusterNodeUser, clusterRouterUser)
	kubeconfig := filepath.Join(b.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		b.Fatal(err)
	}
	const nodeToken, routerToken = "node-token-0123456789abcdef", "router-token-0123456789abcdef"
	d := startDaemon(b, withToken(nodeToken), withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig, "--cluster-node-name", "bench",
		// A create that is deleted at once still holds its reservation until the node's next
		// status (within a second): room for every create of that second.
		"--cluster-memory-mb", "1048576", "--cluster-cpu-overcommit", "1000"))
	waitObject(b, admin, "the node published", client.ObjectKey{Name: "bench"}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if n.Status.Address != d.URL {
			return fmt.Errorf("address %q", n.Status.Address)
		}
		return nil
	})
	routerURL := startRouter(b, cp, routerToken, nodeToken)
	do := func(base, token, method, path string, body any, want int) {
		var r io.Reader
		if body != nil {
			j, _ := json.Marshal(body)
			r = bytes.NewReader(j)
		}
		req, _ := http.NewRequestWithContext(ctx, method, base+path, r)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			b.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, msg)
		}
	}
	do(d.URL, nodeToken, "POST", "/v1/sandboxes", map[string]any{"id": "bench-exec", "start": true}, 201)
	for _, via := range []struct{ name, url, token string }{{"direct", d.URL, nodeToken}, {"router", routerURL, routerToken}} {
		b.Run("create-delete/"+via.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("bench-%s-%d", via.name, i)
				do(via.url, via.token, "POST", "/v1/sandboxes", map[string]any{"id": id}, 201)
				do(via.url, via.token, "DELETE", "/v1/sandboxes/"+id, nil, 204)
			}
		})
		b.Run("exec/"+via.name, func(b *testing.B) {
			for b.Loop() {
				do(via.url, via.token, "POST", "/v1/sandboxes/bench-exec/exec", map[string]any{"command": []string{"true"}}, 200)
			}
		})
		// The exec websocket's stdout, 64 MiB an iteration, as BenchmarkStreamThroughput
		// reads it from one bothyd.
		b.Run("stream/"+via.name, func(b *testing.B) {
			const size = 64 << 20
			u := strings.Replace(via.url, "http://", "ws://", 1) + "/v1/sandboxes/bench-exec/exec/stream?" +
				neturl.Values{"command": {"head", "-c", "64M", "/dev/zero"}}.Encode()
			dialer := websocket.Dialer{ReadBufferSize: 64 << 10}
			b.SetBytes(size)
			for b.Loop() {
				conn, _, err := dialer.DialContext(ctx, u, http.Header{"Authorization": {"Bearer " + via.token}})
				if err != nil {
					b.Fatal(err)
				}
				n, code, err := drainStream(conn)
				conn.Close()
				if err != nil || code != 0 || n != size {
					b.Fatalf("streamed %d bytes, exit %d, %v", n, code, err)
				}
			}
		})
	}
}
