//go:build !unix

package main

import "log/slog"

// raiseNoFile does nothing where there is no RLIMIT_NOFILE; bothyd serves only on Linux,
// and this stub keeps the command building elsewhere.
func raiseNoFile(*slog.Logger) uint64 { return 0 }
