package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/bothy/bothy/check"
	"github.com/bothy/bothy/handlers"
	"github.com/bothy/bothy/idempotency"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/portlink"
	"github.com/bothy/bothy/secret"
	"github.com/bothy/bothy/webhook"
)

// openWebhooks opens the webhooks' records and outboxes (package webhook). Deliveries never go
// to the sandboxes' subnets (the network pool) nor to private addresses, unless the operator
// allows private ones.
func openWebhooks(o *options, log *slog.Logger) (*webhook.Manager, error) {
	deny := []netip.Prefix{network.DefaultPool}
	if o.networkPool != "" {
		if p, err := netip.ParsePrefix(o.networkPool); err == nil {
			deny = append(deny, p.Masked())
		}
	}
	if o.webhookAllowPrivate {
		log.Warn("webhook deliveries may reach private addresses (--webhook-allow-private): any client with the API token can make this host send requests to its own network")
	}
	m, err := webhook.Open(webhook.Options{
		Root: o.root, AllowPrivate: o.webhookAllowPrivate, DenyPrefixes: deny,
		Resolver: o.webhookResolver, EventTypes: handlers.EventTypes, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("the webhooks: %w", err)
	}
	return m, nil
}

// openSecrets opens the secrets (package secret).
func openSecrets(o *options, uses func(string) []secret.Use, log *slog.Logger) (*secret.Manager, error) {
	m, err := secret.Open(secret.Options{Root: o.root, Uses: uses, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("the secrets: %w", err)
	}
	return m, nil
}

// checkWebhooks is the webhooks' check as the checker takes it (check.StoreCheck).
func checkWebhooks(root string) check.StoreCheck {
	return func(repair bool) ([]check.Problem, bool, error) {
		probs, busy, err := webhook.Check(root, repair)
		out := make([]check.Problem, 0, len(probs))
		for _, p := range probs {
			out = append(out, check.Problem{Kind: p.Kind, Entry: filepath.Join(webhook.Dir, p.Entry), Detail: p.Detail, Repaired: p.Repaired})
		}
		return out, busy, err
	}
}

// openRecords opens the port links and the answers of idempotent creates (Idempotency-Key),
// both kept in the state root across restarts. A node of a cluster (node is its name, else
// "") tags its links' ids with its name, by which a router finds it (docs/cluster.md).
func openRecords(root, node string, log *slog.Logger) (*portlink.Store, *idempotency.Store, error) {
	links, err := portlink.OpenNode(root, node)
	if err != nil {
		return nil, nil, err
	}
	idem, err := idempotency.Open(root, idempotency.Options{Logger: log})
	if err != nil {
		return nil, nil, err
	}
	return links, idem, nil
}
