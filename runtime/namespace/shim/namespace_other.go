//go:build !linux

package shim

import (
	"fmt"
	"os"
)

// The namespace runtime needs Linux; these stubs keep the module building elsewhere.

// ShimMain is unsupported off Linux.
func ShimMain(args []string) int {
	fmt.Fprintln(os.Stderr, "sandboxd: the namespace runtime needs Linux")
	return 1
}

// InitMain is unsupported off Linux.
func InitMain(args []string) int { return ShimMain(args) }
