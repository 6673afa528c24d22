package controller

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/cluster/placement"
)

const ns = "bothy-system"

func liveLease(name string, now time.Time) *coordinationv1.Lease {
	holder, secs := name, int32(15)
	renew := metav1.NewMicroTime(now)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: node.LeaseName(name)},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &renew},
	}
}

func bothyNode(name string, slots int32) *v1alpha1.BothyNode {
	return &v1alpha1.BothyNode{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1alpha1.BothyNodeStatus{
			Health:   v1alpha1.NodeHealthy,
			Capacity: v1alpha1.Capacity{MemoryMB: 1 << 20, MilliCPU: 1 << 20, Sandboxes: slots},
			Free:     v1alpha1.Capacity{MemoryMB: 1 << 20, MilliCPU: 1 << 20, Sandboxes: slots},
		},
	}
}

func sandbox(name string, mutate func(*v1alpha1.Sandbox)) *v1alpha1.Sandbox {
	s := &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if mutate != nil {
		mutate(s)
	}
	return s
}

// TestPlace: the objects users made are placed (spread by the placer's reservations, or on
// the node they name), with the label, the annotation, spec.nodeName and the finalizer; an
// object a node made, one being deleted and one naming a node that does not exist are left
// as they are; more objects than slots leave the rest waiting.
func TestPlace(t *testing.T) {
	now := time.Now()
	scheme, err := node.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	deleting := metav1.NewTime(now)
	objs := []client.Object{
		bothyNode("a", 2), bothyNode("b", 2), bothyNode("gone", 5),
		liveLease("a", now), liveLease("b", now), // "gone" has no lease: not live
		sandbox("u1", nil), sandbox("u2", nil), sandbox("u3", nil),
		sandbox("pinned", func(s *v1alpha1.Sandbox) { s.Spec.NodeName = "b" }),
		sandbox("nowhere", func(s *v1alpha1.Sandbox) { s.Spec.NodeName = "no-such-node" }),
		sandbox("made-by-a-node", func(s *v1alpha1.Sandbox) { s.Labels = map[string]string{v1alpha1.NodeLabel: "a"} }),
		sandbox("deleting", func(s *v1alpha1.Sandbox) {
			s.DeletionTimestamp, s.Finalizers = &deleting, []string{"example.com/hold"}
		}),
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	if err := Place(context.Background(), c, ns, placement.New(), now, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	placed := map[string]int{}
	for _, name := range []string{"u1", "u2", "u3", "pinned", "nowhere", "made-by-a-node", "deleting"} {
		var s v1alpha1.Sandbox
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
			t.Fatal(err)
		}
		on := s.Annotations[v1alpha1.PlacedAnnotation]
		switch name {
		case "nowhere", "made-by-a-node", "deleting":
			if on != "" || slices.Contains(s.Finalizers, v1alpha1.Finalizer) {
				t.Errorf("%s was placed on %q (finalizers %v); want it left alone", name, on, s.Finalizers)
			}
			continue
		case "pinned":
			if on != "b" {
				t.Errorf("pinned placed on %q, want the node it names, b", on)
			}
		}
		if on == "" {
			continue // no room left: it waits
		}
		if s.Labels[v1alpha1.NodeLabel] != on || s.Spec.NodeName != on || !slices.Contains(s.Finalizers, v1alpha1.Finalizer) {
			t.Errorf("%s placed on %s: labels %v nodeName %q finalizers %v", name, on, s.Labels, s.Spec.NodeName, s.Finalizers)
		}
		placed[on]++
	}
	// Four slots on the live nodes (the lost one takes none), and pinned goes to b whatever
	// its room: a, 2 and b, 1 from the placer, plus pinned.
	if placed["a"] != 2 || placed["b"] != 2 || placed["gone"] != 0 {
		t.Fatalf("placed %v; want two on a, two on b (pinned among them), none on the lost node", placed)
	}
}
