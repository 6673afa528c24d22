package node

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/supervisor"
)

// statusDebounce gathers the status rewrites that a burst of events asks for into one.
const statusDebounce = time.Second

// publishStatus writes the BothyNode's status when an event asks for it (at most once per
// statusDebounce) and every StatusPeriod, until ctx ends.
func (n *Node) publishStatus(ctx context.Context) {
	tick := time.NewTicker(n.cfg.StatusPeriod)
	defer tick.Stop()
	first := true
	for {
		if err := n.PublishStatus(ctx); err != nil {
			if ctx.Err() == nil {
				n.log.Warn("cluster: publishing the node's status failed; retrying", "err", err)
			}
			if !sleep(ctx, n.cfg.RetryPeriod) {
				return
			}
			continue
		}
		if first {
			close(n.published) // the lease may be taken now (holdLease)
			first = false
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-n.status:
			if !sleep(ctx, statusDebounce) {
				return
			}
		}
	}
}

// PublishStatus makes the BothyNode, if there is none, and writes its status now. It never
// writes the spec, which is the operator's (cordon, drain).
func (n *Node) PublishStatus(ctx context.Context) error {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(v1alpha1.GroupVersion.String())
	obj.SetKind("BothyNode")
	obj.SetName(n.cfg.Name)
	if err := n.c.Patch(ctx, obj, client.Apply, n.owner, client.ForceOwnership); err != nil {
		return err
	}
	st, err := n.Status()
	if err != nil {
		return err
	}
	body := &v1alpha1.BothyNode{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "BothyNode"},
		ObjectMeta: metav1.ObjectMeta{Name: n.cfg.Name},
		Status:     *st,
	}
	u, err := toApply(body, true)
	if err != nil {
		return err
	}
	return n.c.Status().Patch(ctx, u, client.Apply, n.owner, client.ForceOwnership)
}

// Status is the node's status as it would publish it now.
func (n *Node) Status() (*v1alpha1.BothyNodeStatus, error) {
	sandboxes, err := n.cfg.Sandboxes.List()
	if err != nil {
		return nil, err
	}
	alloc := Allocated(sandboxes)
	now := metav1.NowMicro()
	st := &v1alpha1.BothyNodeStatus{
		Address:   n.cfg.Address,
		StartID:   n.startID,
		Version:   n.cfg.Version,
		Capacity:  n.cfg.Capacity,
		Allocated: alloc,
		Free:      free(n.cfg.Capacity, alloc),
		Sandboxes: int32(len(sandboxes)), //nolint:gosec // a node holds thousands, not billions
		Health:    v1alpha1.NodeHealthy,
		Drain:     n.drainState.status(len(sandboxes)),
		UpdatedAt: &now,
	}
	if n.cfg.Health != nil {
		st.Health, st.HealthMessage = n.cfg.Health()
	}
	// A node holding more images or generations than the status lists says so, so that
	// placement never takes it for one that lacks an image it holds but does not list.
	if n.cfg.Images != nil {
		images := n.cfg.Images()
		st.Images, st.ImagesIncomplete = capped(images, maxListed), len(images) > maxListed
	}
	if n.cfg.Generations != nil {
		gens := n.cfg.Generations()
		st.Generations, st.GenerationsIncomplete = capped(gens, maxListed), len(gens) > maxListed
	}
	if n.cfg.Volumes != nil {
		st.Volumes = capped(n.cfg.Volumes(), maxListed)
	}
	if n.cfg.Secrets != nil {
		st.Secrets = capped(n.cfg.Secrets(), maxListed)
	}
	return st, nil
}

// maxListed is the most images or generations a status lists: the CRD's bound.
const maxListed = 256

func capped[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Allocated is what sandboxes hold of a node: a slot each, and the memory and CPU limits of
// each that is not stopped or only provisioned (a paused sandbox keeps its memory). Limits,
// not use: placement must keep every sandbox able to reach its limits at once.
func Allocated(sandboxes []*supervisor.Status) v1alpha1.Capacity {
	var a v1alpha1.Capacity
	for _, st := range sandboxes {
		a.Sandboxes++
		if st.State == supervisor.StateStopped || st.State == supervisor.StateProvisioned {
			continue
		}
		a.MemoryMB += int64(st.Config.Resources.MemoryMB)
		a.MilliCPU += int64(st.Config.Resources.VCPUs) * 1000
	}
	return a
}

// free is capacity less allocated, never below zero.
func free(capacity, alloc v1alpha1.Capacity) v1alpha1.Capacity {
	return v1alpha1.Capacity{
		MemoryMB:  max(0, capacity.MemoryMB-alloc.MemoryMB),
		MilliCPU:  max(0, capacity.MilliCPU-alloc.MilliCPU),
		Sandboxes: max(0, capacity.Sandboxes-alloc.Sandboxes),
	}
}
