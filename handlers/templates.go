package handlers

import (
	"context"

	"github.com/sandboxd/sandboxd/openapi"
)

func (h *Handlers) ListTemplates(context.Context, openapi.ListTemplatesRequestObject) (openapi.ListTemplatesResponseObject, error) {
	return nil, notImplemented("Listing templates")
}

func (h *Handlers) CreateTemplate(context.Context, openapi.CreateTemplateRequestObject) (openapi.CreateTemplateResponseObject, error) {
	return nil, notImplemented("Creating a template")
}

func (h *Handlers) GetTemplate(context.Context, openapi.GetTemplateRequestObject) (openapi.GetTemplateResponseObject, error) {
	return nil, notImplemented("Getting a template")
}

func (h *Handlers) DeleteTemplate(context.Context, openapi.DeleteTemplateRequestObject) (openapi.DeleteTemplateResponseObject, error) {
	return nil, notImplemented("Deleting a template")
}

func (h *Handlers) ListGenerations(context.Context, openapi.ListGenerationsRequestObject) (openapi.ListGenerationsResponseObject, error) {
	return nil, notImplemented("Listing generations")
}

func (h *Handlers) CaptureGeneration(context.Context, openapi.CaptureGenerationRequestObject) (openapi.CaptureGenerationResponseObject, error) {
	return nil, notImplemented("Capturing a generation")
}

func (h *Handlers) GetGeneration(context.Context, openapi.GetGenerationRequestObject) (openapi.GetGenerationResponseObject, error) {
	return nil, notImplemented("Getting a generation")
}

func (h *Handlers) TombstoneGeneration(context.Context, openapi.TombstoneGenerationRequestObject) (openapi.TombstoneGenerationResponseObject, error) {
	return nil, notImplemented("Tombstoning a generation")
}

func (h *Handlers) RetireGeneration(context.Context, openapi.RetireGenerationRequestObject) (openapi.RetireGenerationResponseObject, error) {
	return nil, notImplemented("Retiring a generation")
}

func (h *Handlers) ListLeases(context.Context, openapi.ListLeasesRequestObject) (openapi.ListLeasesResponseObject, error) {
	return nil, notImplemented("Listing leases")
}
