//go:build !linux

package platform

// IsTerminal reports false: bothyd runs only on Linux, and this stub exists so that the
// pure parts of the module build and test elsewhere.
func IsTerminal(fd uintptr) bool { return false }
