package handlers

import (
	"context"
	"net/http"

	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/server"
	"github.com/bothy/bothy/supervisor"
)

// Checkpointer is what the checkpoint and fork routes need of the supervisor; a Supervisor
// without it answers them not-implemented.
type Checkpointer interface {
	Checkpoint(ctx context.Context, id, name string) (*checkpoint.Checkpoint, error)
	Checkpoints(ctx context.Context, id string) ([]checkpoint.Checkpoint, error)
	DeleteCheckpoint(ctx context.Context, id, name string) error
	Rollback(ctx context.Context, id, name string) (*checkpoint.Checkpoint, error)
	Fork(ctx context.Context, id string, req supervisor.ForkRequest) (*supervisor.ForkResult, error)
}

var _ Checkpointer = (*supervisor.Supervisor)(nil)

func (h *Handlers) checkpointer() (Checkpointer, error) {
	c, ok := h.sup.(Checkpointer)
	if !ok {
		return nil, errcode.New(errcode.NotImplemented, "This server has no checkpoints.")
	}
	return c, nil
}

func apiCheckpoint(c *checkpoint.Checkpoint) openapi.Checkpoint {
	out := openapi.Checkpoint{
		Name:      c.Name,
		CreatedAt: c.CreatedAt,
		SizeBytes: c.Size,
		Mode:      openapi.CheckpointMode(c.Mode),
		Layers:    len(c.Chain),
	}
	if c.FreezeMS > 0 {
		out.FreezeMs = &c.FreezeMS
	}
	return out
}

func (h *Handlers) CreateCheckpoint(ctx context.Context, req openapi.CreateCheckpointRequestObject) (openapi.CreateCheckpointResponseObject, error) {
	c, err := h.checkpointer()
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, errcode.Invalid("name", "A checkpoint needs a name.")
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	cp, err := c.Checkpoint(ctx, req.ID, req.Body.Name)
	if err != nil {
		return nil, err
	}
	return openapi.CreateCheckpoint201JSONResponse(apiCheckpoint(cp)), nil
}

func (h *Handlers) ListCheckpoints(ctx context.Context, req openapi.ListCheckpointsRequestObject) (openapi.ListCheckpointsResponseObject, error) {
	c, err := h.checkpointer()
	if err != nil {
		return nil, err
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	list, err := c.Checkpoints(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	out := openapi.ListCheckpoints200JSONResponse{Items: make([]openapi.Checkpoint, 0, len(list))}
	for i := range list {
		out.Items = append(out.Items, apiCheckpoint(&list[i]))
	}
	return out, nil
}

func (h *Handlers) GetCheckpoint(ctx context.Context, req openapi.GetCheckpointRequestObject) (openapi.GetCheckpointResponseObject, error) {
	c, err := h.checkpointer()
	if err != nil {
		return nil, err
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	list, err := c.Checkpoints(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	for i := range list {
		if list[i].Name == req.Name {
			return openapi.GetCheckpoint200JSONResponse(apiCheckpoint(&list[i])), nil
		}
	}
	return nil, errcode.New(errcode.CheckpointNotFound, "Sandbox %s has no checkpoint named %s; list its checkpoints to see their names.", req.ID, req.Name)
}

func (h *Handlers) DeleteCheckpoint(ctx context.Context, req openapi.DeleteCheckpointRequestObject) (openapi.DeleteCheckpointResponseObject, error) {
	c, err := h.checkpointer()
	if err != nil {
		return nil, err
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	if err := c.DeleteCheckpoint(ctx, req.ID, req.Name); err != nil {
		return nil, err
	}
	return openapi.DeleteCheckpoint204Response{}, nil
}

func (h *Handlers) RollbackSandbox(ctx context.Context, req openapi.RollbackSandboxRequestObject) (openapi.RollbackSandboxResponseObject, error) {
	c, err := h.checkpointer()
	if err != nil {
		return nil, err
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	if _, err := c.Rollback(ctx, req.ID, req.Name); err != nil {
		return nil, err
	}
	st, err := h.sup.Status(req.ID)
	if err != nil {
		return nil, err
	}
	return openapi.RollbackSandbox200JSONResponse(apiSandbox(st)), nil
}

func (h *Handlers) ForkSandbox(ctx context.Context, req openapi.ForkSandboxRequestObject) (openapi.ForkSandboxResponseObject, error) {
	c, err := h.checkpointer()
	if err != nil {
		return nil, err
	}
	var fr supervisor.ForkRequest
	if req.Body != nil {
		if req.Body.Count != nil {
			fr.Count = *req.Body.Count
		}
		if req.Body.Ids != nil {
			fr.IDs = *req.Body.Ids
		}
	}
	ctx, cancel := deadline(ctx, req.Params.Timeout, defaultTimeout)
	defer cancel()
	res, err := c.Fork(ctx, req.ID, fr)
	if err != nil {
		return nil, err
	}
	out := openapi.ForkSandbox200JSONResponse{FreezeMs: res.FreezeMS, Items: make([]openapi.ForkItem, 0, len(res.Forks))}
	for _, f := range res.Forks {
		item := openapi.ForkItem{ID: f.ID}
		if f.Err != nil {
			status, code, detail := server.ProblemOf(f.Err)
			if status >= 500 {
				h.log.Error("a fork failed", "sandbox", req.ID, "fork", f.ID, "err", f.Err)
			}
			item.Error = &openapi.Problem{
				Type: "urn:bothyd:problem:" + string(code), Title: http.StatusText(status),
				Status: status, Detail: detail, Code: openapi.ErrorCode(code),
			}
		} else if f.Status != nil {
			sb := apiSandbox(f.Status)
			item.Sandbox = &sb
		}
		out.Items = append(out.Items, item)
	}
	return out, nil
}
