package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// Drain (docs/cluster.md, "Drain"). A node's sandboxes are stateful and node-local (their
// store, disk and processes are on this host, and no runtime moves a running one), so a
// drain ends them in place rather than moving them: the node refuses every create
// (node-draining, so that nothing new lands on a node being emptied, whoever sends it), lets
// its sandboxes run until their lifetimes end or their owners delete them, and at the
// operator's spec.drainDeadline deletes, forced, those still left. Its status says how many
// remain and, once none does, drained. A drain called off (spec.draining false) admits
// creates again. A cordon is placement's alone: the node still takes a create sent to it
// (an operator's, or an object naming it), as a kubelet takes a pod bound to a cordoned node.

// drainState is what the node read of its BothyNode's spec, and what the drain did.
type drainState struct {
	mu      sync.Mutex
	spec    v1alpha1.BothyNodeSpec
	deleted int32
	changed chan struct{}
}

func newDrainState() *drainState { return &drainState{changed: make(chan struct{}, 1)} }

func (d *drainState) set(spec v1alpha1.BothyNodeSpec) {
	d.mu.Lock()
	if !spec.Draining {
		d.deleted = 0
	}
	d.spec = spec
	d.mu.Unlock()
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

func (d *drainState) get() (v1alpha1.BothyNodeSpec, int32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.spec, d.deleted
}

// status is the drain's part of the node's status for remaining sandboxes; nil when the node
// does not drain.
func (d *drainState) status(remaining int) *v1alpha1.DrainStatus {
	spec, deleted := d.get()
	if !spec.Draining {
		return nil
	}
	return &v1alpha1.DrainStatus{Remaining: int32(remaining), Drained: remaining == 0, Deadline: spec.DrainDeadline, Deleted: deleted} //nolint:gosec // thousands
}

// watchSpec follows the node's own BothyNode (by name) and acts on its spec: the drain.
func (n *Node) watchSpec(ctx context.Context) {
	scheme, err := Scheme()
	if err != nil {
		n.log.Error("cluster: the BothyNode cannot be watched", "err", err)
		return
	}
	go n.drain(ctx)
	for ctx.Err() == nil {
		c, err := cache.New(n.cfg.Rest, cache.Options{
			Scheme: scheme,
			ByObject: map[client.Object]cache.ByObject{
				&v1alpha1.BothyNode{}: {Field: fields.OneTermEqualSelector("metadata.name", n.cfg.Name)},
			},
		})
		if err == nil {
			err = n.followSpec(ctx, c)
		}
		if err != nil && ctx.Err() == nil {
			n.log.Warn("cluster: watching the node's BothyNode failed; retrying", "err", err)
			if !sleep(ctx, n.cfg.RetryPeriod) {
				return
			}
		}
	}
}

func (n *Node) followSpec(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.BothyNode{})
	if err != nil {
		return err
	}
	seen := func(obj any) {
		if b, ok := obj.(*v1alpha1.BothyNode); ok && b.Name == n.cfg.Name {
			n.drainState.set(b.Spec)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
	}); err != nil {
		return err
	}
	return c.Start(ctx)
}

// drain acts on the spec the watch read: the admission's refusal follows spec.draining, and
// at the deadline the sandboxes left are deleted.
func (n *Node) drain(ctx context.Context) {
	var timer *time.Timer
	var fire <-chan time.Time
	wasDraining := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.drainState.changed:
		case <-fire:
		}
		spec, _ := n.drainState.get()
		n.admission.SetDraining(spec.Draining)
		if spec.Draining != wasDraining {
			if spec.Draining {
				n.log.Info("cluster: draining: this node takes no new sandbox", "deadline", spec.DrainDeadline)
			} else {
				n.log.Info("cluster: the drain is called off: this node takes new sandboxes again")
			}
			wasDraining = spec.Draining
		}
		n.wantStatus()
		if timer != nil {
			timer.Stop()
			fire = nil
		}
		if !spec.Draining || spec.DrainDeadline == nil {
			continue
		}
		if wait := time.Until(spec.DrainDeadline.Time); wait > 0 {
			timer = time.NewTimer(wait)
			fire = timer.C
			continue
		}
		if !n.deleteLeft(ctx) && ctx.Err() == nil {
			// Some delete failed: try again shortly.
			timer = time.NewTimer(n.cfg.RetryPeriod)
			fire = timer.C
		}
	}
}

// event records a Kubernetes Event on the Sandbox object of id (`kubectl get events`,
// `kubectl describe sandbox`), which outlives the object by the events' own lifetime. A
// failure is logged: the event is the cluster's note, the sandbox's own event stream has it
// too.
func (n *Node) event(ctx context.Context, id, reason, message string) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: id + ".", Namespace: n.cfg.Namespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Sandbox",
			Namespace: n.cfg.Namespace, Name: id},
		Reason: reason, Message: message, Type: corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "bothy-node", Host: n.cfg.Name},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "cluster.bothy.dev/node", ReportingInstance: n.cfg.Name,
	}
	if err := n.c.Create(ctx, ev); err != nil {
		n.log.Warn("cluster: recording an event", "sandbox", id, "reason", reason, "err", err)
	}
}

// deleteLeft deletes, forced, every sandbox the node holds past its drain's deadline, and
// says whether all went.
func (n *Node) deleteLeft(ctx context.Context) bool {
	if n.cfg.Delete == nil {
		return true
	}
	sandboxes, err := n.cfg.Sandboxes.List()
	if err != nil {
		n.log.Warn("cluster: the drain cannot list the sandboxes left", "err", err)
		return false
	}
	ok := true
	for _, st := range sandboxes {
		if spec, _ := n.drainState.get(); !spec.Draining {
			return true // called off meanwhile
		}
		id := st.Config.ID
		if err := n.cfg.Delete(ctx, id); err != nil {
			n.log.Warn("cluster: the drain could not delete a sandbox at its deadline; retrying", "sandbox", id, "err", err)
			ok = false
			continue
		}
		n.drainState.mu.Lock()
		n.drainState.deleted++
		n.drainState.mu.Unlock()
		n.log.Info("cluster: the drain's deadline passed: deleted a sandbox", "sandbox", id)
		n.event(ctx, id, "Drained", fmt.Sprintf("Node %s is drained and its deadline passed: the sandbox was deleted.", n.cfg.Name))
	}
	n.wantStatus()
	return ok
}
