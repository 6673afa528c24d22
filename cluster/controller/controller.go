// Package controller is the cluster's controller (`bothyd controller`, docs/cluster.md):
// any number of replicas run, one leads through a coordination.k8s.io Lease, and the leader
// marks the Sandbox objects of every node whose lease has lapsed node-lost, so that lists of
// the cluster (kubectl get sandboxes) read those sandboxes as unreachable rather than as they
// last were, and places the Sandbox objects users make (kubectl apply) on a node (place.go),
// which then creates their sandboxes. When the node comes back its own reconcile writes their real state again,
// taking the field back (server-side apply, forced).
//
// It must not change a sandbox or decide anything a node is the authority for: node-lost is
// the cluster's reading of a node, not a state of the sandbox.
//
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=bothy-system,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=cluster.bothy.dev,namespace=bothy-system,resources=sandboxes,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.bothy.dev,resources=bothynodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.bothy.dev,namespace=bothy-system,resources=sandboxes/status,verbs=get;update;patch
package controller

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/node"
	"github.com/bothy/bothy/cluster/placement"
)

// LeaseName is the controllers' election lease, in the cluster's namespace.
const LeaseName = "bothy-controller"

// fieldOwner is the controller's field manager: node-lost is its, the real state the node's.
const fieldOwner = client.FieldOwner("bothy-controller")

// Config configures the controller.
type Config struct {
	Rest      *rest.Config
	Client    client.Client
	Namespace string
	// Identity tells the replicas apart in the election lease; unique per replica (the pod's
	// name).
	Identity string
	// The election's timing; client-go's defaults (15 s, 10 s, 2 s) when zero.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Period is how often the leader looks at the nodes' leases; RetryPeriod when zero.
	Period time.Duration
	Logger *slog.Logger
}

// Run takes part in the election until ctx ends, and while it leads marks lost nodes'
// sandboxes.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Rest == nil || cfg.Client == nil || cfg.Namespace == "" || cfg.Identity == "" {
		return errors.New("controller: the API server, a client, the namespace and an identity are required")
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.LeaseDuration, node.DefaultLeaseDuration}, {&cfg.RenewDeadline, node.DefaultRenewDeadline}, {&cfg.RetryPeriod, node.DefaultRetryPeriod}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Period == 0 {
		cfg.Period = cfg.RetryPeriod
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cs, err := coordinationclient.NewForConfig(cfg.Rest)
	if err != nil {
		return err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: cfg.Namespace},
		Client:     cs,
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, Name: LeaseName, ReleaseOnCancel: true,
			LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					cfg.Logger.Info("controller: leading", "identity", cfg.Identity)
					lead(ctx, cfg)
				},
				OnStoppedLeading: func() { cfg.Logger.Info("controller: no longer leading", "identity", cfg.Identity) },
			},
		})
		if err != nil {
			return err
		}
		le.Run(ctx)
	}
	return nil
}

// lead marks lost nodes' sandboxes and places the Sandbox objects users made every Period
// until ctx ends. Its placer's reservations live as long as its leadership: a new leader
// starts with none, and reads the nodes' published allocation, which the nodes update
// within a second of a create.
func lead(ctx context.Context, cfg Config) {
	tick := time.NewTicker(cfg.Period)
	defer tick.Stop()
	placer := placement.New()
	requested := watchRequested(ctx, cfg)
	for {
		if err := MarkLost(ctx, cfg.Client, cfg.Namespace, time.Now()); err != nil && ctx.Err() == nil {
			cfg.Logger.Warn("controller: marking lost nodes' sandboxes", "err", err)
		}
		if err := Place(ctx, cfg.Client, cfg.Namespace, placer, time.Now(), cfg.Logger); err != nil && ctx.Err() == nil {
			cfg.Logger.Warn("controller: placing Sandbox objects", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-requested:
		}
	}
}

// MarkLost marks node-lost every Sandbox of a node whose lease has lapsed by now, and which
// does not read so already. It reads the leases (one per node) every time, and a node's
// sandboxes only when the node is lost.
func MarkLost(ctx context.Context, c client.Client, namespace string, now time.Time) error {
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.InNamespace(namespace)); err != nil {
		return err
	}
	var errs []error
	for _, l := range leases.Items {
		name, ok := strings.CutPrefix(l.Name, node.LeasePrefix)
		if !ok || name == "" {
			continue
		}
		if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == name &&
			node.LeaseLive(l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second, now) {
			continue
		}
		var sandboxes v1alpha1.SandboxList
		if err := c.List(ctx, &sandboxes, client.InNamespace(namespace), client.MatchingLabels{v1alpha1.NodeLabel: name}); err != nil {
			errs = append(errs, err)
			continue
		}
		var lapsed time.Time // when the lease lapsed; zero for a lease never renewed
		if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
			lapsed = l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
		}
		for _, s := range sandboxes.Items {
			if s.Status.State == v1alpha1.StateNodeLost {
				continue
			}
			// A status the node wrote after its lease lapsed is a node coming back, not one
			// lost: it is renewing, and the next look will see so.
			if s.Status.ObservedAt != nil && !lapsed.IsZero() && s.Status.ObservedAt.After(lapsed) {
				continue
			}
			u := &unstructured.Unstructured{}
			u.SetAPIVersion(v1alpha1.GroupVersion.String())
			u.SetKind("Sandbox")
			u.SetNamespace(namespace)
			u.SetName(s.Name)
			// The version read: if the node wrote since (it is back), the API server refuses
			// this write rather than let it bury the node's.
			u.SetResourceVersion(s.ResourceVersion)
			_ = unstructured.SetNestedField(u.Object, string(v1alpha1.StateNodeLost), "status", "state")
			err := c.Status().Patch(ctx, u, client.Apply, fieldOwner, client.ForceOwnership)
			if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
