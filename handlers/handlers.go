package handlers

import (
	"context"
	"log/slog"

	"github.com/sandboxd/sandboxd/errcode"
	"github.com/sandboxd/sandboxd/openapi"
)

// The handlers must implement every operation of the contract.
var _ openapi.StrictServerInterface = (*Handlers)(nil)

// Config is what the handlers need from the command line.
type Config struct {
	Root    string // the state root
	Version string // sandboxd's version, reported by /v1/info
	Logger  *slog.Logger
}

// Handlers implements openapi.StrictServerInterface.
type Handlers struct {
	cfg Config
	log *slog.Logger
}

// New returns the handlers for a state root.
func New(cfg Config) (*Handlers, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handlers{cfg: cfg, log: cfg.Logger}, nil
}

// notImplemented is the answer of operations that later work will build.
func notImplemented(operation string) error {
	return errcode.New(errcode.NotImplemented, "%s is not implemented in this version of sandboxd.", operation)
}

func (h *Handlers) GetHealth(context.Context, openapi.GetHealthRequestObject) (openapi.GetHealthResponseObject, error) {
	return openapi.GetHealth200JSONResponse{Status: "ok"}, nil
}

func (h *Handlers) GetInfo(context.Context, openapi.GetInfoRequestObject) (openapi.GetInfoResponseObject, error) {
	return nil, notImplemented("GET /v1/info")
}
