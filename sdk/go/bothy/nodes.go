package bothy

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/bothy/bothy/openapi/client"
)

// The node types of the contract: a cluster's nodes as its router sees them
// (docs/cluster.md). A single bothyd is no cluster: it answers the nodes calls with
// [ErrNotACluster], and [Info]'s Cluster is nil.
type (
	Node         = client.Node
	NodeCapacity = client.NodeCapacity
	NodeDrain    = client.NodeDrain
)

func nodePath(name string) string { return "/v1/nodes/" + url.PathEscape(name) }

// Nodes lists the cluster's nodes, in name order.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var list client.NodeList
	if err := c.get(ctx, "/v1/nodes", nil, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// GetNode returns one node of the cluster ([ErrNodeNotFound] for a name none has).
func (c *Client) GetNode(ctx context.Context, name string) (*Node, error) {
	var n Node
	if err := c.get(ctx, nodePath(name), nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// NodeChange is the operator's part of a node that PatchNode writes; a nil field is left
// as it is.
type NodeChange struct {
	// Cordoned: placement puts nothing new on the node; it keeps serving its own.
	Cordoned *bool
	// Draining: the node refuses creates and empties (docs/cluster.md's Drain).
	Draining *bool
	// DrainDeadline is when a draining node deletes what it still holds; see
	// ClearDrainDeadline to remove it.
	DrainDeadline *time.Time
	// ClearDrainDeadline removes the deadline (the node then waits for its sandboxes to end).
	ClearDrainDeadline bool
}

// PatchNode writes a node's cordon and drain and returns the node after the change.
func (c *Client) PatchNode(ctx context.Context, name string, change NodeChange) (*Node, error) {
	body := map[string]any{}
	if change.Cordoned != nil {
		body["cordoned"] = *change.Cordoned
	}
	if change.Draining != nil {
		body["draining"] = *change.Draining
	}
	switch {
	case change.ClearDrainDeadline:
		body["drain_deadline"] = nil
	case change.DrainDeadline != nil:
		body["drain_deadline"] = change.DrainDeadline.UTC().Format(time.RFC3339Nano)
	}
	in, err := jsonBody(body)
	if err != nil {
		return nil, err
	}
	var n Node
	if _, err := c.call(ctx, request{method: http.MethodPatch, path: nodePath(name), body: in, ctype: "application/json"}, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// CordonNode marks a node so that placement puts nothing new on it.
func (c *Client) CordonNode(ctx context.Context, name string) (*Node, error) {
	on := true
	return c.PatchNode(ctx, name, NodeChange{Cordoned: &on})
}

// UncordonNode makes a cordoned node a candidate for placement again.
func (c *Client) UncordonNode(ctx context.Context, name string) (*Node, error) {
	off := false
	return c.PatchNode(ctx, name, NodeChange{Cordoned: &off})
}

// DrainNode drains a node: it takes no new sandbox, and at deadline (if not zero) deletes
// those it still holds.
func (c *Client) DrainNode(ctx context.Context, name string, deadline time.Time) (*Node, error) {
	on := true
	change := NodeChange{Draining: &on}
	if !deadline.IsZero() {
		change.DrainDeadline = &deadline
	}
	return c.PatchNode(ctx, name, change)
}
