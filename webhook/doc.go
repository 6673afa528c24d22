// Package webhook delivers bothyd's lifecycle events to the URLs that clients register, signed,
// retried, and from a durable outbox, so that a receiver that is down, or a server that
// crashes, loses none of them. It knows nothing of HTTP serving or of sandboxes beyond the
// contract's [openapi.Event]: cmd/bothyd hands it every event the bus publishes
// ([Manager.Enqueue]), package handlers serves /v1/webhooks from it, and package check judges
// its records ([Check]).
//
// It must never send a delivery to an address that the host or its sandboxes keep private
// unless the operator said so, never follow a redirect, never log a secret, and never let a
// receiver hold more than its bounds (time, bytes, connections).
//
// # Records
//
// Everything lives in <root>/webhooks (mode 0700):
//
//	lock             held (flock) by the server that delivers; `bothyd check` repairs only when it is free
//	<id>.json        the webhook: its URL, event types, secret and creation time (mode 0600)
//	<id>/            its outbox: one <event id>.json per event not yet delivered, and state.json
//
// A webhook's record is written durably before its outbox directory is made and before it is
// answered; a delete removes the record first, durably, then the outbox. An outbox entry is
// written durably, in the event's publication (the supervisor's OnEvent hook), before anything
// tries to deliver it, and removed only after the receiver answered 2xx: a crash at any point
// delivers it again after the restart (at least once). The start-up, and `bothyd check
// --repair` when no server runs, remove what an interrupted write or delete left: temporary
// files, and outboxes whose record is gone.
//
// # The secret at rest
//
// The signing secret must be known in the clear to sign, so it is kept as given, in the
// webhook's record, which is mode 0600 in a directory of mode 0700 under the state root (as
// the API token and the port links' key are): whoever can read it can also read the state
// root. It never appears in an answer, a log line, or an error; [Webhook] has no field for it.
//
// # Delivery
//
// Each webhook delivers its outbox in order of event id, one request at a time, so a receiver
// sees events in the order they happened, and at most [Options].MaxConcurrent deliveries run
// at once across webhooks. A delivery is a POST of the event as the event stream's `data`
// (JSON), with headers naming the webhook, the event, its type, the attempt, a timestamp and
// the signature: `Bothy-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`
// (docs/webhooks.md). Anything but a 2xx answer within the timeout, a redirect included, is a
// failure, retried after a backoff that doubles from [Options].RetryBase up to RetryMax; an
// event still undelivered after MaxAge is given up and counted as failed.
//
// # Addresses
//
// A delivery connects only to an address that is public: not loopback, link-local, private
// (RFC 1918, ULA), shared (RFC 6598), multicast, unspecified or reserved, nor in a sandbox
// subnet ([Options].DenyPrefixes), unless [Options].AllowPrivate. The check is made by the
// dialer on the address it is about to connect to, after resolution, so a name that resolves
// to a public address when the webhook is made and to a private one later (DNS rebinding)
// cannot steer a delivery; no proxy from the environment is used.
package webhook
