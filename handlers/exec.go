package handlers

import (
	"context"

	"github.com/sandboxd/sandboxd/openapi"
)

func (h *Handlers) ExecCommand(context.Context, openapi.ExecCommandRequestObject) (openapi.ExecCommandResponseObject, error) {
	return nil, notImplemented("Exec")
}
