//go:build !linux

package shim

import (
	"fmt"
	"os"
)

// The microVM runtime needs Linux (KVM or TCG under QEMU, its sockets and namespaces); these
// stubs keep the module building elsewhere.

func shimMain(args []string) int {
	fmt.Fprintln(os.Stderr, "bothyd: the microVM runtime needs Linux")
	return 1
}

func fsdMain(args []string) int { return shimMain(args) }
