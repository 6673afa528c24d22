package handlers

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/sandboxd/sandboxd/errcode"
	"github.com/sandboxd/sandboxd/openapi"
	"github.com/sandboxd/sandboxd/store"
	"github.com/sandboxd/sandboxd/supervisor"
)

// The handlers must implement every operation of the contract.
var _ openapi.StrictServerInterface = (*Handlers)(nil)

// Defaults of the contract's optional parameters.
const (
	defaultTimeout     = 30 * time.Second // lifecycle transitions
	defaultExecTimeout = 60 * time.Second // a buffered exec's workload
	defaultExecWait    = 60 * time.Second // exec admission
	defaultListLimit   = 100
)

// Config is what the handlers need.
type Config struct {
	Supervisor *supervisor.Supervisor
	// DefaultResources fill in what a create request leaves out.
	DefaultResources store.Resources
	Version          string // sandboxd's version, reported by /v1/info
	MaxJSONBytes     int64
	MaxFileBytes     int64
	Logger           *slog.Logger
}

// Handlers implements openapi.StrictServerInterface.
type Handlers struct {
	cfg     Config
	sup     *supervisor.Supervisor
	log     *slog.Logger
	streams streamSet
}

// New returns the handlers.
func New(cfg Config) (*Handlers, error) {
	if cfg.Supervisor == nil {
		return nil, errors.New("handlers: a supervisor is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handlers{cfg: cfg, sup: cfg.Supervisor, log: cfg.Logger}, nil
}

// notImplemented is the answer of operations that later work will build.
func notImplemented(operation string) error {
	return errcode.New(errcode.NotImplemented, "%s is not implemented in this version of sandboxd.", operation)
}

// deadline turns an optional timeout in milliseconds (validated by the contract: 1..3600000)
// into a context.
func deadline(ctx context.Context, ms *int, def time.Duration) (context.Context, context.CancelFunc) {
	d := def
	if ms != nil {
		d = time.Duration(*ms) * time.Millisecond
	}
	return context.WithTimeout(ctx, d)
}

func (h *Handlers) GetHealth(context.Context, openapi.GetHealthRequestObject) (openapi.GetHealthResponseObject, error) {
	return openapi.GetHealth200JSONResponse{Status: "ok"}, nil
}
