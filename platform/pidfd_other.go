//go:build !linux

package platform

import "context"

// WaitExit is unsupported: bothyd runs only on Linux; the stub keeps the module building.
func WaitExit(ctx context.Context, p ProcessID) error { return ErrUnsupported }
