//go:build !linux

package platform

import (
	"context"
	"net"
)

// DialUnix is unsupported: sandboxd runs only on Linux; the stub keeps the module building.
func DialUnix(ctx context.Context, path string) (net.Conn, error) { return nil, ErrUnsupported }
