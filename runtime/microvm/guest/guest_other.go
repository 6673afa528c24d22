//go:build !linux

package guest

// Main is the guest's init; the guest is Linux.
func Main(args []string) int { return 2 }
