package controller

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/cluster/placement"
)

// The resources placement reserves for a Sandbox object that names none: the nodes' defaults,
// as the router assumes for a create that names none.
const (
	defaultMemoryMB = 512
	defaultMilliCPU = 1000
)

// Place places every Sandbox object a user made (no node label: no node wrote it, and no
// controller placed it yet) that is not being deleted: on the node its spec names, or on the
// node placer chooses. Placing is one update of the object, sent with the version read, so
// two leaders (one that lost its lease without knowing yet) never place one object twice:
// the API server refuses the second. The update sets the node label, the placed annotation
// and spec.nodeName, and adds the finalizer, so that from then on a delete of the object
// waits for the node to delete the sandbox. The node does the rest (cluster/node).
func Place(ctx context.Context, c client.Client, namespace string, placer *placement.Placer, now time.Time, log *slog.Logger) error {
	// Only the unplaced: the API server filters by the label's absence, so a look costs
	// little however many sandboxes the cluster holds.
	unplaced, err := labels.Parse("!" + v1alpha1.NodeLabel)
	if err != nil {
		return err
	}
	var objs v1alpha1.SandboxList
	if err := c.List(ctx, &objs, client.InNamespace(namespace), client.MatchingLabelsSelector{Selector: unplaced}); err != nil {
		return err
	}
	var pending []*v1alpha1.Sandbox
	for i := range objs.Items {
		o := &objs.Items[i]
		if o.Labels[v1alpha1.NodeLabel] == "" && o.DeletionTimestamp == nil {
			pending = append(pending, o)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	nodes, err := placementNodes(ctx, c, namespace, now)
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range pending {
		target := o.Spec.NodeName
		var res *placement.Reservation
		if target == "" {
			res, err = placer.Place(nodes, request(o))
			if err != nil {
				// Left unplaced; the next look tries again, when a node may have room.
				log.Warn("controller: no node can take a Sandbox object now; it waits", "sandbox", o.Name, "err", err)
				continue
			}
			target = res.Node()
		} else if !slices.ContainsFunc(nodes, func(n placement.Node) bool { return n.Name == target }) {
			log.Warn("controller: a Sandbox object asks for a node that does not exist; it waits for it", "sandbox", o.Name, "node", target)
			continue
		}
		if o.Labels == nil {
			o.Labels = map[string]string{}
		}
		if o.Annotations == nil {
			o.Annotations = map[string]string{}
		}
		o.Labels[v1alpha1.NodeLabel] = target
		o.Annotations[v1alpha1.PlacedAnnotation] = target
		o.Spec.NodeName = target
		if !slices.Contains(o.Finalizers, v1alpha1.Finalizer) {
			o.Finalizers = append(o.Finalizers, v1alpha1.Finalizer)
		}
		err := c.Update(ctx, o, fieldOwner)
		if err != nil {
			if res != nil {
				res.Release()
			}
			// A conflict or a deletion: the object changed since it was read; the next look
			// reads it again.
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
			continue
		}
		if res != nil {
			res.Done(time.Now())
		}
		log.Info("controller: placed a Sandbox object", "sandbox", o.Name, "node", target)
	}
	return errors.Join(errs...)
}

// request is what placement reserves for o.
func request(o *v1alpha1.Sandbox) placement.Request {
	r := placement.Request{MemoryMB: defaultMemoryMB, MilliCPU: defaultMilliCPU, Image: o.Spec.Image}
	if o.Spec.Resources.MemoryMB > 0 {
		r.MemoryMB = int64(o.Spec.Resources.MemoryMB)
	}
	if o.Spec.Resources.VCPUs > 0 {
		r.MilliCPU = int64(o.Spec.Resources.VCPUs) * 1000
	}
	if t := o.Spec.Template; t != nil {
		r.Template, r.Generation = t.Template, t.Generation
	}
	return r
}

// placementNodes reads every BothyNode and whether its lease is live by now.
func placementNodes(ctx context.Context, c client.Client, namespace string, now time.Time) ([]placement.Node, error) {
	var bns v1alpha1.BothyNodeList
	if err := c.List(ctx, &bns); err != nil {
		return nil, err
	}
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, l := range leases.Items {
		name, ok := strings.CutPrefix(l.Name, node.LeasePrefix)
		if !ok || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != name {
			continue
		}
		live[name] = node.LeaseLive(l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, now)
	}
	out := make([]placement.Node, 0, len(bns.Items))
	for _, n := range bns.Items {
		out = append(out, placement.Node{Name: n.Name, Live: live[n.Name], Spec: n.Spec, Status: n.Status})
	}
	return out, nil
}

// watchRequested watches the unplaced Sandbox objects while ctx lasts, and signals on the
// channel it returns when one is made, so that the leader places it at once rather than at
// its next look. Without a watch (it could not be set up) the looks alone place them.
func watchRequested(ctx context.Context, cfg Config) <-chan struct{} {
	poke := make(chan struct{}, 1)
	unplaced, err := labels.Parse("!" + v1alpha1.NodeLabel)
	if err != nil {
		return poke
	}
	scheme, err := node.Scheme()
	if err != nil {
		return poke
	}
	c, err := cache.New(cfg.Rest, cache.Options{
		Scheme:            scheme,
		DefaultNamespaces: map[string]cache.Config{cfg.Namespace: {}},
		ByObject:          map[client.Object]cache.ByObject{&v1alpha1.Sandbox{}: {Label: unplaced}},
	})
	if err != nil {
		cfg.Logger.Warn("controller: no watch of the Sandbox objects; placing them at each look", "err", err)
		return poke
	}
	inf, err := c.GetInformer(ctx, &v1alpha1.Sandbox{})
	if err != nil {
		cfg.Logger.Warn("controller: no watch of the Sandbox objects; placing them at each look", "err", err)
		return poke
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: func(any) {
		select {
		case poke <- struct{}{}:
		default:
		}
	}}); err != nil {
		cfg.Logger.Warn("controller: no watch of the Sandbox objects; placing them at each look", "err", err)
		return poke
	}
	go func() {
		if err := c.Start(ctx); err != nil && ctx.Err() == nil {
			cfg.Logger.Warn("controller: the watch of the Sandbox objects stopped; placing them at each look", "err", err)
		}
	}()
	return poke
}
