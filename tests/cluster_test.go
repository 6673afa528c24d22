package tests

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

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
	cp := kubetest.Start(t, kubetest.Options{Users: []string{clusterNodeUser}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin, err := node.NewClient(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := config.Install(ctx, admin); err != nil {
		t.Fatal(err)
	}
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
			return false, err
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

	// SIGKILL: nothing renews the lease, which lapses by the observer's clock.
	killed := time.Now()
	d.Kill()
	waitCond(t, 3*leaseDuration, "the killed node's lease to lapse", func() (bool, error) {
		live, err := leaseLive()
		return !live, err
	})
	t.Logf("the lease lapsed %v after the SIGKILL (lease duration %v)", time.Since(killed).Round(time.Millisecond), leaseDuration)

	// While the node is down its objects drift: kube-1's is deleted by hand, another says
	// the wrong state, and an object of this node's names a sandbox it never had.
	if err := admin.Delete(ctx, &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: "kube-1"}}); err != nil {
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
}

// waitObject waits until the object at key exists and check accepts it.
func waitObject[T client.Object](t *testing.T, c client.Client, what string, key client.ObjectKey, obj T, check func(T) error) {
	t.Helper()
	last := errors.New("not found")
	deadline := time.Now().Add(30 * time.Second)
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
			t.Fatalf("timed out waiting for %s; last: %v", what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
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

// waitCond waits until cond holds, failing on its error or at the deadline.
func waitCond(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
