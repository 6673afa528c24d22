package handlers

import (
	"context"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/secret"
)

// Secrets is what the handlers need of the secrets ([secret.Manager]). It has no way to read
// a value: the handlers never see one but in a create or rotate request.
type Secrets interface {
	Create(name, value string) (*secret.Secret, error)
	Rotate(name, value string) (*secret.Secret, error)
	Get(name string) (*secret.Secret, error)
	List() []secret.Secret
	Delete(name string) error
}

var _ Secrets = (*secret.Manager)(nil)

func (h *Handlers) secrets() (Secrets, error) {
	if h.cfg.Secrets == nil {
		return nil, errcode.New(errcode.NotImplemented, "This server keeps no secrets.")
	}
	return h.cfg.Secrets, nil
}

// CreateSecret stores a secret (see package secret); the answer never carries its value.
func (h *Handlers) CreateSecret(_ context.Context, req openapi.CreateSecretRequestObject) (openapi.CreateSecretResponseObject, error) {
	store, err := h.secrets()
	if err != nil {
		return nil, err
	}
	if req.Body == nil || req.Body.Value == nil {
		return nil, errcode.Invalid("value", "Send a JSON object with name and value.")
	}
	s, err := store.Create(req.Body.Name, *req.Body.Value)
	if err != nil {
		return nil, err
	}
	loc := "/v1/secrets/" + s.Name
	return openapi.CreateSecret201JSONResponse{Body: secretOf(s), Headers: openapi.CreateSecret201ResponseHeaders{Location: &loc}}, nil
}

// RotateSecret replaces a secret's value.
func (h *Handlers) RotateSecret(_ context.Context, req openapi.RotateSecretRequestObject) (openapi.RotateSecretResponseObject, error) {
	store, err := h.secrets()
	if err != nil {
		return nil, err
	}
	if req.Body == nil || req.Body.Value == nil {
		return nil, errcode.Invalid("value", "Send a JSON object with the new value.")
	}
	s, err := store.Rotate(req.Secret, *req.Body.Value)
	if err != nil {
		return nil, err
	}
	return openapi.RotateSecret200JSONResponse(secretOf(s)), nil
}

// ListSecrets lists the secrets, never their values, a page at a time by name in byte order
// (upper case before lower case), so that a page's last name is the next page's cursor, as
// in every other list. A secret's name is not of the id rule (it has upper case and '_'),
// so a cursor is checked against the secret name rule (the contract's SecretCursor).
func (h *Handlers) ListSecrets(_ context.Context, req openapi.ListSecretsRequestObject) (openapi.ListSecretsResponseObject, error) {
	store, err := h.secrets()
	if err != nil {
		return nil, err
	}
	page, next, err := paginateKeys(store.List(), req.Params.Cursor, req.Params.Limit, func(s secret.Secret) string { return s.Name }, secret.ValidName)
	if err != nil {
		return nil, err
	}
	out := openapi.ListSecrets200JSONResponse{Items: make([]openapi.Secret, 0, len(page)), NextCursor: next}
	for i := range page {
		out.Items = append(out.Items, secretOf(&page[i]))
	}
	return out, nil
}

// GetSecret shows one secret.
func (h *Handlers) GetSecret(_ context.Context, req openapi.GetSecretRequestObject) (openapi.GetSecretResponseObject, error) {
	store, err := h.secrets()
	if err != nil {
		return nil, err
	}
	s, err := store.Get(req.Secret)
	if err != nil {
		return nil, err
	}
	return openapi.GetSecret200JSONResponse(secretOf(s)), nil
}

// DeleteSecret deletes a secret no sandbox binds.
func (h *Handlers) DeleteSecret(_ context.Context, req openapi.DeleteSecretRequestObject) (openapi.DeleteSecretResponseObject, error) {
	store, err := h.secrets()
	if err != nil {
		return nil, err
	}
	if err := store.Delete(req.Secret); err != nil {
		return nil, err
	}
	return openapi.DeleteSecret204Response{}, nil
}

// secretOf is s as the contract has it: secret.Secret carries no value to leak.
func secretOf(s *secret.Secret) openapi.Secret {
	out := openapi.Secret{Name: s.Name, CreatedAt: s.CreatedAt, RotatedAt: s.RotatedAt, Bindings: make([]openapi.SecretUse, 0, len(s.Uses))}
	for _, u := range s.Uses {
		out.Bindings = append(out.Bindings, openapi.SecretUse{Sandbox: u.Sandbox, Hosts: u.Hosts})
	}
	return out
}
