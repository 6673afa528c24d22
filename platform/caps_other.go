//go:build !linux

package platform

import "errors"

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

// LimitThreadCapabilities is unsupported off Linux.
func LimitThreadCapabilities(keep []string) error { return ErrUnsupported }

// SetNoNewPrivs is unsupported off Linux.
func SetNoNewPrivs() error { return ErrUnsupported }

// ErrAllThreadsUnsupported is returned by the whole-process variants.
var ErrAllThreadsUnsupported = errors.New("platform: per-process credential changes need Linux")

// LimitProcessCapabilities is unsupported off Linux.
func LimitProcessCapabilities(keep []string) error { return ErrUnsupported }

// BoundThreadCapabilities is unsupported off Linux.
func BoundThreadCapabilities(keep []string) error { return ErrUnsupported }
