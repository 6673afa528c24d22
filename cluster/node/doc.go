// Package node is bothyd's node mode (bothyd --cluster-node): it joins a bothyd to a cluster
// whose state lives in Kubernetes (docs/cluster.md). It holds the node's coordination.k8s.io
// Lease, renewed on leader-election timing, so that the cluster can tell a node that is gone;
// publishes the node's capacity, free resources and health in its BothyNode's status; and
// mirrors the node's sandboxes into Sandbox objects, from the supervisor's events and, at
// start-up, by reconciling every object against the node's store.
//
// The node stays the authority for its own sandboxes: this package writes what the node's
// supervisor says, and never changes a sandbox because an object says otherwise. It must not
// touch another node's objects.
//
// The RBAC rules below are what the package needs, generated into ../config/rbac by
// controller-gen (../api/v1alpha1/generate.go).
//
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=bothy-system,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=cluster.bothy.dev,namespace=bothy-system,resources=sandboxes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cluster.bothy.dev,namespace=bothy-system,resources=sandboxes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.bothy.dev,resources=bothynodes,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=cluster.bothy.dev,resources=bothynodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",namespace=bothy-system,resources=events,verbs=create
package node
