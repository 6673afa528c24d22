package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/handlers"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// objectActions are what node mode does for a Sandbox object made with kubectl
// (docs/cluster.md): it creates the sandbox through the same handler as the REST API's
// create, with the same defaults and checks, and deletes it as the REST API's forced delete
// does. The handlers are made after node mode starts (it follows the supervisor's events
// from the first), so they are set when the server is about to serve; until then a create
// fails and the node retries it.
type objectActions struct {
	h   atomic.Pointer[handlers.Handlers]
	sup **supervisor.Supervisor
}

// create makes the sandbox obj asks for: its name is the id, and it is started.
func (a *objectActions) create(ctx context.Context, obj *v1alpha1.Sandbox) (v1alpha1.SandboxState, error) {
	h := a.h.Load()
	if h == nil {
		return "", errors.New("the node is starting and does not serve creates yet")
	}
	body, err := createBody(obj)
	if err != nil {
		return "", err
	}
	resp, err := h.CreateSandbox(ctx, openapi.CreateSandboxRequestObject{Body: body})
	if err != nil {
		return "", err
	}
	created, ok := resp.(openapi.CreateSandbox201JSONResponse)
	if !ok {
		return "", fmt.Errorf("the create answered %T", resp)
	}
	return v1alpha1.SandboxState(created.Body.State), nil
}

// deleteTimeout bounds a delete of a sandbox for its object, as the REST API's default
// timeout bounds one through it.
const deleteTimeout = time.Minute

// delete deletes the sandbox id, running or not.
func (a *objectActions) delete(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, deleteTimeout)
	defer cancel()
	return (*a.sup).Delete(ctx, id, true)
}

// createBody is the REST API's create request for obj's spec. It goes through the
// contract's own type (by its JSON), so a field of the spec maps to the field of the
// request of the same meaning and nothing else.
func createBody(obj *v1alpha1.Sandbox) (*openapi.CreateSandboxRequest, error) {
	s := obj.Spec
	m := map[string]any{"id": obj.Name, "start": true}
	if s.Image != "" {
		m["image"] = s.Image
	}
	if s.Template != nil {
		m["template"] = s.Template.Template
		if s.Template.Generation != "" {
			m["generation"] = s.Template.Generation
		}
	}
	if s.Runtime != "" {
		m["runtime"] = s.Runtime
	}
	res := map[string]any{}
	for k, v := range map[string]int32{"vcpus": s.Resources.VCPUs, "memory_mb": s.Resources.MemoryMB, "pids": s.Resources.Pids, "disk_mb": s.Resources.DiskMB} {
		if v > 0 {
			res[k] = v
		}
	}
	if len(res) > 0 {
		m["resources"] = res
	}
	if s.Internet {
		m["network"] = map[string]any{"internet": true}
	}
	if len(s.Labels) > 0 {
		m["labels"] = s.Labels
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	var body openapi.CreateSandboxRequest
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, fmt.Errorf("the Sandbox object's spec is no create request: %w", err)
	}
	return &body, nil
}
