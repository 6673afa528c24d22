package handlers

import (
	"context"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
)

// notACluster is a single bothyd's answer to the nodes API: the cluster router
// (cluster/router) serves it, from the BothyNode objects a single bothyd has none of. A node
// of a cluster answers the same, since a client that reaches a node directly should ask the
// router, which sees every node.
func notACluster() error {
	return errcode.New(errcode.NotACluster, "This bothyd is not a cluster router: the nodes API is served by `bothyd router` (docs/cluster.md). Call the cluster's router, or use the sandboxes API of this server.")
}

// ListNodes answers 501 not-a-cluster (notACluster).
func (h *Handlers) ListNodes(context.Context, openapi.ListNodesRequestObject) (openapi.ListNodesResponseObject, error) {
	return nil, notACluster()
}

// GetNode answers 501 not-a-cluster (notACluster).
func (h *Handlers) GetNode(context.Context, openapi.GetNodeRequestObject) (openapi.GetNodeResponseObject, error) {
	return nil, notACluster()
}

// PatchNode answers 501 not-a-cluster (notACluster).
func (h *Handlers) PatchNode(context.Context, openapi.PatchNodeRequestObject) (openapi.PatchNodeResponseObject, error) {
	return nil, notACluster()
}
