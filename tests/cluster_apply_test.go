package tests

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
)

// TestClusterSandboxApply: a Sandbox object made with the API server's client (what kubectl
// apply does) is placed by the controller, made running by its node and mirrored; deleting the
// object deletes the sandbox and then the object; a sandbox deleted through the REST API takes
// its object with it and is not made again from it. Two crashes of the node (SIGKILL): while
// an object is placed on it, and in the middle of making its sandbox (after the launch was
// recorded, before the object's status was written): after the restart each object has
// exactly one sandbox, running. A third crash comes after the create returned, before the
// node wrote the object's status.
func TestClusterSandboxApply(t *testing.T) {
	cp, admin, ctx := startInstalledCluster(t, 5*time.Minute, clusterNodeUser, clusterControllerUser)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, clusterNodeUser); err != nil {
		t.Fatal(err)
	}
	const name = "node-a"
	// The crash-point build behaves as any bothyd until BOTHYD_CRASH_AT is set.
	d := startDaemon(t, withBinary(crashBothyd(t)), withArgs("--cluster-node", "--cluster-kubeconfig", kubeconfig,
		"--cluster-node-name", name, "--cluster-lease-duration", "6s", "--cluster-max-sandboxes", "20"))
	startController(t, cp, "ctl-1")
	waitObject(t, admin, "the BothyNode's status", client.ObjectKey{Name: name}, &v1alpha1.BothyNode{}, func(n *v1alpha1.BothyNode) error {
		if n.Status.Health != v1alpha1.NodeHealthy || n.Status.Capacity.Sandboxes != 20 {
			return fmt.Errorf("status %+v", n.Status)
		}
		return nil
	})
	key := func(id string) client.ObjectKey { return client.ObjectKey{Namespace: config.Namespace, Name: id} }
	apply := func(id string, spec v1alpha1.SandboxSpec) {
		t.Helper()
		obj := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: id}, Spec: spec}
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatalf("creating the Sandbox object %s: %v", id, err)
		}
	}
	running := func(s *v1alpha1.Sandbox) error {
		if s.Status.Node != name || s.Status.State != v1alpha1.StateRunning || s.Labels[v1alpha1.NodeLabel] != name ||
			s.Annotations[v1alpha1.PlacedAnnotation] != name || !slices.Contains(s.Finalizers, v1alpha1.Finalizer) {
			return fmt.Errorf("node %q state %q labels %v annotations %v finalizers %v message %q", s.Status.Node, s.Status.State, s.Labels, s.Annotations, s.Finalizers, s.Status.Message)
		}
		return nil
	}
	// ids lists the node's sandboxes through its REST API.
	ids := func() []string {
		t.Helper()
		r := d.doJSON("GET", "/v1/sandboxes", nil)
		if r.Status != 200 {
			t.Fatalf("list: %d %s", r.Status, r.Body)
		}
		var page struct {
			Items []struct {
				ID string `json:"id"`
			} `json:"items"`
		}
		if err := json.Unmarshal(r.Body, &page); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range page.Items {
			out = append(out, s.ID)
		}
		return out
	}

	// kubectl apply: placed by the controller (no node named), made running by the node.
	applied := time.Now()
	apply("kube-apply-1", v1alpha1.SandboxSpec{Resources: v1alpha1.Resources{MemoryMB: 256}, Labels: map[string]string{"team": "a"}})
	waitObject(t, admin, "kube-apply-1 placed", key("kube-apply-1"), &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
		if s.Labels[v1alpha1.NodeLabel] != name {
			return fmt.Errorf("labels %v", s.Labels)
		}
		return nil
	})
	t.Logf("kube-apply-1 placed %v after its object was created", time.Since(applied).Round(time.Millisecond))
	waitObject(t, admin, "kube-apply-1 running", key("kube-apply-1"), &v1alpha1.Sandbox{}, running)
	t.Logf("kube-apply-1 read running %v after its object was created", time.Since(applied).Round(time.Millisecond))
	r := d.doJSON("GET", "/v1/sandboxes/kube-apply-1", nil)
	var got struct {
		State     string `json:"state"`
		Resources struct {
			MemoryMB int `json:"memory_mb"`
		} `json:"resources"`
		Labels map[string]string `json:"labels"`
	}
	if r.Status != 200 || json.Unmarshal(r.Body, &got) != nil || got.State != "running" || got.Resources.MemoryMB != 256 || got.Labels["team"] != "a" {
		t.Fatalf("kube-apply-1 on the node's REST API: %d %s; want running with 256 MiB and the label", r.Status, r.Body)
	}
	if r := d.doJSON("POST", "/v1/sandboxes/kube-apply-1/exec", map[string]any{"command": []string{"true"}}); r.Status != 200 {
		t.Fatalf("exec in kube-apply-1: %d %s", r.Status, r.Body)
	}

	// kubectl delete: the sandbox goes, then the object.
	if err := admin.Delete(ctx, &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: "kube-apply-1"}}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitGone(t, admin, key("kube-apply-1"))
	t.Logf("kube-apply-1's object was gone %v after its delete", time.Since(deleted).Round(time.Millisecond))
	if r := d.doJSON("GET", "/v1/sandboxes/kube-apply-1", nil); r.Status != 404 {
		t.Fatalf("kube-apply-1 after its object was deleted: %d %s; want 404", r.Status, r.Body)
	}

	// A sandbox made through the REST API and deleted through it: its object goes, and is not
	// taken for a request to make the sandbox again.
	if r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "rest-1", "start": true}); r.Status != 201 {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	waitObject(t, admin, "rest-1 mirrored", key("rest-1"), &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
		if s.Status.State != v1alpha1.StateRunning || !slices.Contains(s.Finalizers, v1alpha1.Finalizer) || s.Annotations[v1alpha1.PlacedAnnotation] != "" {
			return fmt.Errorf("state %q finalizers %v annotations %v", s.Status.State, s.Finalizers, s.Annotations)
		}
		return nil
	})
	if r := d.doJSON("DELETE", "/v1/sandboxes/rest-1?force=true", nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	waitGone(t, admin, key("rest-1"))
	if l := ids(); len(l) != 0 {
		t.Fatalf("sandboxes after rest-1's delete: %v; want none", l)
	}

	// Crash 1: the node is down while an object is placed on it.
	d.Kill()
	apply("kube-apply-2", v1alpha1.SandboxSpec{NodeName: name})
	waitObject(t, admin, "kube-apply-2 placed on the dead node", key("kube-apply-2"), &v1alpha1.Sandbox{}, func(s *v1alpha1.Sandbox) error {
		if s.Labels[v1alpha1.NodeLabel] != name || s.Status.Node != "" {
			return fmt.Errorf("labels %v status node %q", s.Labels, s.Status.Node)
		}
		return nil
	})
	d.start()
	waitObject(t, admin, "kube-apply-2 running after the node's restart", key("kube-apply-2"), &v1alpha1.Sandbox{}, running)

	// Crashes 2 and 3: the node dies after the sandbox's launch is recorded (inside the
	// create), and after the create returned; both before the object's status says so.
	for _, c := range []struct{ id, at string }{{"kube-apply-3", "recorded"}, {"kube-apply-4", "object-sandbox-made"}} {
		d.Stop()
		d.env = []string{"BOTHYD_CRASH_AT=" + c.at}
		d.start()
		apply(c.id, v1alpha1.SandboxSpec{})
		select {
		case <-d.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("bothyd did not die at %s making %s", c.at, c.id)
		}
		var mid v1alpha1.Sandbox
		if err := admin.Get(ctx, key(c.id), &mid); err != nil || mid.Status.Node != "" || mid.Labels[v1alpha1.NodeLabel] != name {
			t.Fatalf("%s at the crash at %s: %v, status node %q, labels %v; want placed and no status", c.id, c.at, err, mid.Status.Node, mid.Labels)
		}
		d.env = nil
		d.start()
		waitObject(t, admin, c.id+" running after the crash at "+c.at, key(c.id), &v1alpha1.Sandbox{}, running)
		if r := d.doJSON("POST", "/v1/sandboxes/"+c.id+"/exec", map[string]any{"command": []string{"true"}}); r.Status != 200 {
			t.Fatalf("exec in %s: %d %s", c.id, r.Status, r.Body)
		}
	}
	if l := ids(); !slices.Equal(l, []string{"kube-apply-2", "kube-apply-3", "kube-apply-4"}) {
		t.Fatalf("the node's sandboxes after the crashes: %v; want exactly kube-apply-2, -3 and -4", l)
	}
	for _, id := range []string{"kube-apply-2", "kube-apply-3", "kube-apply-4"} {
		if err := admin.Delete(ctx, &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: id}}); err != nil {
			t.Fatal(err)
		}
		waitGone(t, admin, key(id))
	}
	if l := ids(); len(l) != 0 {
		t.Fatalf("sandboxes after their objects' deletes: %v; want none", l)
	}
}
