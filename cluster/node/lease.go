package node

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeasePrefix begins the name of every node's Lease: bothy-node-<node>, in the cluster's
// namespace, beside the controller's and anything else's.
const LeasePrefix = "bothy-node-"

// StartLabel is the label of a node's Lease that names the process renewing it: the
// BothyNode status's startID of the same process. A router reads a node live only when its
// lease's label and its status's startID agree (or the lease has no label: a node from
// before the label).
const StartLabel = "cluster.bothy.dev/start-id"

// LeaseName is the name of the Lease of the node called node.
func LeaseName(node string) string { return LeasePrefix + node }

// holdLease holds the node's Lease until ctx ends, with client-go's leader election on a
// lock of the node's own: the holder's identity is the node's name, so a restarted node
// takes its lease back at once rather than wait for it to lapse, while the lease lapses
// LeaseDuration after the last renewal of a node that is gone. Losing the lease (the API
// server unreachable for RenewDeadline) changes nothing on the node, which keeps serving its
// sandboxes; it tries again after RetryPeriod. On a clean shutdown the lease is released,
// so the cluster sees the node gone at once.
func (n *Node) holdLease(ctx context.Context) {
	cs, err := coordinationv1.NewForConfig(n.cfg.Rest)
	if err != nil {
		n.log.Error("cluster: no client for the node's lease", "err", err)
		return
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName(n.cfg.Name), Namespace: n.cfg.Namespace},
		Client:     cs,
		LockConfig: resourcelock.ResourceLockConfig{Identity: n.cfg.Name},
		// Written at every renewal, so the lease names this process from its first one.
		Labels: map[string]string{StartLabel: n.startID},
	}
	// The status first: a router must never read this process's lease beside the last
	// process's address. Until the status names this process, its lease is not taken.
	select {
	case <-ctx.Done():
		return
	case <-n.published:
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			Name:            LeaseName(n.cfg.Name),
			LeaseDuration:   n.cfg.LeaseDuration,
			RenewDeadline:   n.cfg.RenewDeadline,
			RetryPeriod:     n.cfg.RetryPeriod,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					n.log.Info("cluster: holding the node's lease", "lease", LeaseName(n.cfg.Name))
					// While the lease was lapsed the controller may have marked this node's
					// objects node-lost: write them all again, as they are.
					if err := n.Reconcile(ctx); err != nil && ctx.Err() == nil {
						n.log.Warn("cluster: reconciling on taking the lease", "err", err)
					}
					<-ctx.Done()
				},
				OnStoppedLeading: func() {
					if ctx.Err() == nil {
						n.log.Warn("cluster: lost the node's lease; the cluster will read this node as lost until it is renewed", "lease", LeaseName(n.cfg.Name))
					}
				},
			},
		})
		if err != nil {
			n.log.Error("cluster: the node's lease", "err", err)
			return
		}
		le.Run(ctx)
		sleep(ctx, n.cfg.RetryPeriod)
	}
}

// LeaseLive says whether a lease that was last renewed at renew for duration is live at now:
// the rule by which the cluster's other parts judge a node. It takes the observer's clock,
// so a node whose clock is ahead cannot keep itself alive.
func LeaseLive(renew time.Time, duration time.Duration, now time.Time) bool {
	return !renew.IsZero() && now.Before(renew.Add(duration))
}
