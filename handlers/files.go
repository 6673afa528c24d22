package handlers

import (
	"context"

	"github.com/sandboxd/sandboxd/openapi"
)

func (h *Handlers) ReadFile(context.Context, openapi.ReadFileRequestObject) (openapi.ReadFileResponseObject, error) {
	return nil, notImplemented("Reading files")
}

func (h *Handlers) WriteFile(context.Context, openapi.WriteFileRequestObject) (openapi.WriteFileResponseObject, error) {
	return nil, notImplemented("Writing files")
}

func (h *Handlers) RemoveFile(context.Context, openapi.RemoveFileRequestObject) (openapi.RemoveFileResponseObject, error) {
	return nil, notImplemented("Removing files")
}
