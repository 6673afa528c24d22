//go:build !linux

package agent

import (
	"context"
	"errors"
)

// The agent is PID 1 of a Linux sandbox; on other systems it has nothing to run in. The stub
// keeps the rest of bothyd building there.
var errUnsupported = errors.New("agent: the in-sandbox agent is supported on Linux only")

// Run is unsupported on this OS.
func Run(cfg Config) error { return errUnsupported }

// RunContext is unsupported on this OS.
func RunContext(ctx context.Context, cfg Config) error { return errUnsupported }

// PrepareSignals does nothing on this OS.
func PrepareSignals() {}
