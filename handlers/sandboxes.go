package handlers

import (
	"context"

	"github.com/sandboxd/sandboxd/openapi"
)

func (h *Handlers) ListSandboxes(context.Context, openapi.ListSandboxesRequestObject) (openapi.ListSandboxesResponseObject, error) {
	return nil, notImplemented("Listing sandboxes")
}

func (h *Handlers) CreateSandbox(context.Context, openapi.CreateSandboxRequestObject) (openapi.CreateSandboxResponseObject, error) {
	return nil, notImplemented("Creating a sandbox")
}

func (h *Handlers) GetSandbox(context.Context, openapi.GetSandboxRequestObject) (openapi.GetSandboxResponseObject, error) {
	return nil, notImplemented("Getting a sandbox")
}

func (h *Handlers) DeleteSandbox(context.Context, openapi.DeleteSandboxRequestObject) (openapi.DeleteSandboxResponseObject, error) {
	return nil, notImplemented("Deleting a sandbox")
}

func (h *Handlers) StartSandbox(context.Context, openapi.StartSandboxRequestObject) (openapi.StartSandboxResponseObject, error) {
	return nil, notImplemented("Starting a sandbox")
}

func (h *Handlers) StopSandbox(context.Context, openapi.StopSandboxRequestObject) (openapi.StopSandboxResponseObject, error) {
	return nil, notImplemented("Stopping a sandbox")
}

func (h *Handlers) GetSandboxLogs(context.Context, openapi.GetSandboxLogsRequestObject) (openapi.GetSandboxLogsResponseObject, error) {
	return nil, notImplemented("Reading a sandbox's log")
}
