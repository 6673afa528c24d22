//go:build !linux

package platform

// These stubs exist so that the module builds on other systems; sandboxd runs only on Linux.

// LimitThreadCapabilities is unsupported off Linux.
func LimitThreadCapabilities(keep []string) error { return ErrUnsupported }

// SetNoNewPrivs is unsupported off Linux.
func SetNoNewPrivs() error { return ErrUnsupported }
