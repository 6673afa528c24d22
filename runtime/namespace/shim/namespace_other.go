//go:build !linux

package shim

import (
	"fmt"
	"net"
	"os"
)

// The namespace runtime needs Linux; these stubs keep the module building elsewhere.

// ShimMain is unsupported off Linux.
func ShimMain(args []string) int {
	fmt.Fprintln(os.Stderr, "bothyd: the namespace runtime needs Linux")
	return 1
}

// InitMain is unsupported off Linux.
func InitMain(args []string) int { return ShimMain(args) }

// ReleaseMain is unsupported off Linux.
func ReleaseMain(args []string) int { return ShimMain(args) }

// LockDisk is unsupported off Linux.
func LockDisk(img string, exclusive bool, waiting func()) (*os.File, error) {
	return nil, fmt.Errorf("bothyd: the namespace runtime needs Linux")
}

// ServeReleases is unsupported off Linux: there are no releases to take.
func ServeReleases(l *net.UnixListener, failed func(error)) {}
