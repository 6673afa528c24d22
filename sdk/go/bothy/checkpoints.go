package bothy

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/bothy/bothy/openapi/client"
)

// The checkpoint and fork types, as the contract defines them.
type (
	Checkpoint = client.Checkpoint
	ForkResult = client.ForkResult
	ForkItem   = client.ForkItem
)

func checkpointPath(id, name string, rest ...string) string {
	p := sandboxPath(id, "/checkpoints/"+url.PathEscape(name))
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// CreateCheckpoint takes the checkpoint name of the sandbox id's files: a stopped sandbox's
// at no copy, a running one's frozen for the copy of what it wrote since its last checkpoint
// (docs/checkpoints.md).
func (c *Client) CreateCheckpoint(ctx context.Context, id, name string, timeout time.Duration) (*Checkpoint, error) {
	var cp Checkpoint
	if err := c.post(ctx, sandboxPath(id, "/checkpoints"), timeoutQuery(timeout), map[string]string{"name": name}, &cp); err != nil {
		return nil, err
	}
	return &cp, nil
}

// Checkpoints lists the sandbox's checkpoints, oldest first.
func (c *Client) Checkpoints(ctx context.Context, id string) ([]Checkpoint, error) {
	var list client.CheckpointList
	if err := c.get(ctx, sandboxPath(id, "/checkpoints"), nil, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// GetCheckpoint reads one checkpoint.
func (c *Client) GetCheckpoint(ctx context.Context, id, name string) (*Checkpoint, error) {
	var cp Checkpoint
	if err := c.get(ctx, checkpointPath(id, name), nil, &cp); err != nil {
		return nil, err
	}
	return &cp, nil
}

// DeleteCheckpoint removes a checkpoint.
func (c *Client) DeleteCheckpoint(ctx context.Context, id, name string) error {
	_, err := c.call(ctx, request{method: http.MethodDelete, path: checkpointPath(id, name)}, nil)
	return err
}

// Rollback makes the sandbox's files those of its checkpoint name, in place; a running
// sandbox is restarted on them. It returns the sandbox.
func (c *Client) Rollback(ctx context.Context, id, name string, timeout time.Duration) (*Sandbox, error) {
	var sb Sandbox
	if err := c.post(ctx, checkpointPath(id, name, "rollback"), timeoutQuery(timeout), nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Fork makes count new sandboxes (or one for each of ids) that run on from the files of the
// sandbox id as they are now. Each fork succeeds or fails on its own: see each item's
// Sandbox or Error.
func (c *Client) Fork(ctx context.Context, id string, count int, ids []string, timeout time.Duration) (*ForkResult, error) {
	body := map[string]any{}
	if count > 0 {
		body["count"] = count
	}
	if len(ids) > 0 {
		body["ids"] = ids
	}
	var res ForkResult
	if err := c.post(ctx, sandboxPath(id, "/fork"), timeoutQuery(timeout), body, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
