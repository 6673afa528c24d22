package bothy

import (
	"context"
	"net/http"
	"net/url"

	"github.com/bothy/bothy/openapi/client"
)

// The secret types of the contract: a secret as answers show it, never its value.
type (
	Secret    = client.Secret
	SecretUse = client.SecretUse
)

func secretPath(name string) string { return "/v1/secrets/" + url.PathEscape(name) }

// secretWrite is a create's or a rotation's body; the value goes nowhere else.
type secretWrite struct {
	Name  string `json:"name,omitempty"`
	Value string `json:"value"`
}

// CreateSecret stores a secret (docs/secrets.md). The value is write-only: no answer returns
// it; a sandbox's network policy binds the secret to hosts, and bothyd's egress proxy sends it
// there in the place of the sandbox's placeholder.
func (c *Client) CreateSecret(ctx context.Context, name, value string) (*Secret, error) {
	var s Secret
	if err := c.post(ctx, "/v1/secrets", nil, secretWrite{Name: name, Value: value}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// RotateSecret replaces a secret's value; the proxy sends the new one from the next request.
func (c *Client) RotateSecret(ctx context.Context, name, value string) (*Secret, error) {
	var s Secret
	if err := c.post(ctx, secretPath(name)+"/rotate", nil, secretWrite{Value: value}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Secrets lists every secret by name (byte order: upper case first) with the sandboxes that
// bind each, following the pages to the end.
func (c *Client) Secrets(ctx context.Context) ([]Secret, error) {
	return listAll[Secret](ctx, c, "/v1/secrets", url.Values{})
}

// GetSecret returns a secret's times and bindings.
func (c *Client) GetSecret(ctx context.Context, name string) (*Secret, error) {
	var s Secret
	if err := c.get(ctx, secretPath(name), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSecret deletes a secret no sandbox's policy binds (ErrSecretInUse otherwise).
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	_, err := c.call(ctx, request{method: http.MethodDelete, path: secretPath(name)}, nil)
	return err
}
