package node

import (
	"context"

	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// watchObjects watches this node's Sandbox objects (by its label) and queues an object when
// the cluster asks something of the node through it: a new one (placed here by the
// controller), one whose deletion began (kubectl delete), one placed anew, and one gone (an
// object forced away while its sandbox lives is made again). The node's own writes change
// none of these, so they queue nothing and cannot loop.
func (n *Node) watchObjects(ctx context.Context) {
	scheme, err := Scheme()
	if err != nil {
		n.log.Error("cluster: the Sandbox objects cannot be watched", "err", err)
		return
	}
	for ctx.Err() == nil {
		c, err := cache.New(n.cfg.Rest, cache.Options{
			Scheme:            scheme,
			DefaultNamespaces: map[string]cache.Config{n.cfg.Namespace: {}},
			ByObject: map[client.Object]cache.ByObject{
				&v1alpha1.Sandbox{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.NodeLabel: n.cfg.Name})},
			},
		})
		if err == nil {
			err = n.follow(ctx, c)
		}
		if err != nil && ctx.Err() == nil {
			n.log.Warn("cluster: watching the node's Sandbox objects failed; retrying", "err", err)
			if !sleep(ctx, n.cfg.RetryPeriod) {
				return
			}
		}
	}
}

// follow runs c, queuing what watchObjects says, until ctx ends.
func (n *Node) follow(ctx context.Context, c cache.Cache) error {
	inf, err := c.GetInformer(ctx, &v1alpha1.Sandbox{})
	if err != nil {
		return err
	}
	queue := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if s, ok := obj.(*v1alpha1.Sandbox); ok {
			n.queue.Add(s.Name)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: queue,
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*v1alpha1.Sandbox)
			s, ok2 := newObj.(*v1alpha1.Sandbox)
			if !ok1 || !ok2 {
				return
			}
			if (s.DeletionTimestamp != nil && o.DeletionTimestamp == nil) ||
				s.Annotations[v1alpha1.PlacedAnnotation] != o.Annotations[v1alpha1.PlacedAnnotation] {
				n.queue.Add(s.Name)
			}
		},
		DeleteFunc: queue,
	}); err != nil {
		return err
	}
	// No resync of the informer's own: the node's reconcile (Config.Resync) covers what a
	// watch could miss, and a short one would queue every object again and again.
	return c.Start(ctx)
}
