package handlers

import (
	"context"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/webhook"
)

// Webhooks is what the handlers need of the webhooks ([webhook.Manager]).
type Webhooks interface {
	Create(req webhook.CreateRequest) (*webhook.Webhook, error)
	Get(id string) (*webhook.Webhook, error)
	List() []webhook.Webhook
	Delete(id string) error
}

var _ Webhooks = (*webhook.Manager)(nil)

func (h *Handlers) webhooks() (Webhooks, error) {
	if h.cfg.Webhooks == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server does not deliver webhooks.")
	}
	return h.cfg.Webhooks, nil
}

// CreateWebhook registers a webhook (see package webhook).
func (h *Handlers) CreateWebhook(_ context.Context, req openapi.CreateWebhookRequestObject) (openapi.CreateWebhookResponseObject, error) {
	hooks, err := h.webhooks()
	if err != nil {
		return nil, err
	}
	if req.Body == nil {
		return nil, errcode.Invalid("body", "Send a JSON object with url, events and secret.")
	}
	cr := webhook.CreateRequest{URL: req.Body.URL}
	if req.Body.ID != nil {
		cr.ID = *req.Body.ID
	}
	for _, t := range req.Body.Events {
		cr.Events = append(cr.Events, string(t))
	}
	if req.Body.Secret != nil {
		cr.Secret = *req.Body.Secret
	}
	w, err := hooks.Create(cr)
	if err != nil {
		return nil, err
	}
	loc := "/v1/webhooks/" + w.ID
	return openapi.CreateWebhook201JSONResponse{Body: webhookOf(w), Headers: openapi.CreateWebhook201ResponseHeaders{Location: &loc}}, nil
}

// ListWebhooks lists the webhooks with their delivery state.
func (h *Handlers) ListWebhooks(_ context.Context, req openapi.ListWebhooksRequestObject) (openapi.ListWebhooksResponseObject, error) {
	hooks, err := h.webhooks()
	if err != nil {
		return nil, err
	}
	page, next, err := paginate(hooks.List(), req.Params.Cursor, req.Params.Limit, func(w webhook.Webhook) string { return w.ID })
	if err != nil {
		return nil, err
	}
	out := openapi.ListWebhooks200JSONResponse{Items: make([]openapi.Webhook, 0, len(page)), NextCursor: next}
	for i := range page {
		out.Items = append(out.Items, webhookOf(&page[i]))
	}
	return out, nil
}

// GetWebhook shows one webhook.
func (h *Handlers) GetWebhook(_ context.Context, req openapi.GetWebhookRequestObject) (openapi.GetWebhookResponseObject, error) {
	hooks, err := h.webhooks()
	if err != nil {
		return nil, err
	}
	w, err := hooks.Get(req.Webhook)
	if err != nil {
		return nil, err
	}
	return openapi.GetWebhook200JSONResponse(webhookOf(w)), nil
}

// DeleteWebhook deletes a webhook and its outbox.
func (h *Handlers) DeleteWebhook(_ context.Context, req openapi.DeleteWebhookRequestObject) (openapi.DeleteWebhookResponseObject, error) {
	hooks, err := h.webhooks()
	if err != nil {
		return nil, err
	}
	if err := hooks.Delete(req.Webhook); err != nil {
		return nil, err
	}
	return openapi.DeleteWebhook204Response{}, nil
}

// webhookOf is w as the contract has it: never with its secret, which webhook.Webhook does
// not carry.
func webhookOf(w *webhook.Webhook) openapi.Webhook {
	d := w.Delivery
	out := openapi.Webhook{ID: w.ID, URL: w.URL, Events: w.Events, CreatedAt: w.CreatedAt,
		Delivery: openapi.WebhookDelivery{Pending: d.Pending, Delivered: d.Delivered, Failed: d.Failed, Dropped: d.Dropped,
			LastAttemptAt: d.LastAttemptAt, LastSuccessAt: d.LastSuccessAt, NextAttemptAt: d.NextAttemptAt}}
	if d.LastStatus != 0 {
		s := d.LastStatus
		out.Delivery.LastStatus = &s
	}
	if d.LastError != "" {
		e := d.LastError
		out.Delivery.LastError = &e
	}
	return out
}
