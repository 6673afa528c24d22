// Package v1alpha1 is the cluster.bothy.dev/v1alpha1 API: the Kubernetes objects through which
// a cluster of bothyd nodes is one service (docs/cluster.md). A Sandbox is the cluster's record
// of one sandbox: its spec mirrors the create request's essentials and its status names the
// node that holds the sandbox and mirrors that node's view of it. A BothyNode is one node's
// published capacity, free resources and health, and the operator's cordon and drain.
//
// The node is the authority for its sandboxes: these objects are its catalog, written by it,
// never a source of truth that overrides its store. The package holds types only; the CRDs,
// the deepcopy functions and the RBAC rules are generated from it and from the markers in
// package cluster/node by controller-gen (generate.go, ../../config).
//
// +kubebuilder:object:generate=true
// +groupName=cluster.bothy.dev
package v1alpha1
