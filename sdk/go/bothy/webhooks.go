package bothy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/bothy/bothy/openapi/client"
)

// The webhook types of the contract.
type (
	Webhook         = client.Webhook
	WebhookDelivery = client.WebhookDelivery
)

// WebhookOptions make a webhook.
type WebhookOptions struct {
	// ID names the webhook (wh- and 16 hex digits); empty, the server makes one. Repeating a
	// create with the same id, URL, events and secret is idempotent: through a cluster's
	// router it makes the webhook on a node that joined later (docs/cluster.md, "Webhooks").
	ID string `json:"id,omitempty"`
	// URL receives a POST per event.
	URL string `json:"url"`
	// Events are the event types to deliver (at least one).
	Events []string `json:"events"`
	// Secret keys the deliveries' signature (16 to 256 characters); no answer returns it.
	Secret string `json:"secret"`
}

func webhookPath(id string) string { return "/v1/webhooks/" + url.PathEscape(id) }

// CreateWebhook registers a webhook (docs/webhooks.md).
func (c *Client) CreateWebhook(ctx context.Context, o WebhookOptions) (*Webhook, error) {
	var w Webhook
	if err := c.post(ctx, "/v1/webhooks", nil, o, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// Webhooks lists every webhook by id with its delivery state, following the pages to the end.
func (c *Client) Webhooks(ctx context.Context) ([]Webhook, error) {
	return listAll[Webhook](ctx, c, "/v1/webhooks", url.Values{})
}

// GetWebhook returns a webhook and its delivery state.
func (c *Client) GetWebhook(ctx context.Context, id string) (*Webhook, error) {
	var w Webhook
	if err := c.get(ctx, webhookPath(id), nil, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// DeleteWebhook deletes a webhook; its pending events are not delivered.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	_, err := c.call(ctx, request{method: http.MethodDelete, path: webhookPath(id)}, nil)
	return err
}

// VerifyWebhook reports whether a delivery's Bothy-Signature header signs its body with
// secret, and its Bothy-Timestamp is within maxSkew of now (0: five minutes), which bounds how
// long a captured delivery could be replayed. Drop repeats by the Bothy-Event-Id header:
// deliveries are at least once.
func VerifyWebhook(secret []byte, h http.Header, body []byte, maxSkew time.Duration) bool {
	if maxSkew <= 0 {
		maxSkew = 5 * time.Minute
	}
	ts := h.Get("Bothy-Timestamp")
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(n, 0)).Abs() > maxSkew {
		return false
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts + "."))
	m.Write(body)
	want := "v1=" + hex.EncodeToString(m.Sum(nil))
	return hmac.Equal([]byte(want), []byte(h.Get("Bothy-Signature")))
}

type idempotencyKey struct{}

// WithIdempotencyKey makes the creates made with ctx idempotent: each POST carries key as its
// Idempotency-Key, so that repeating it (after a timeout, or a restart of the server) returns
// the first answer instead of creating again. Use one key per intended create.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, key)
}
