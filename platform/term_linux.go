//go:build linux

package platform

import "golang.org/x/sys/unix"

// IsTerminal reports whether fd is a terminal, to choose coloured logs.
func IsTerminal(fd uintptr) bool {
	_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
	return err == nil
}
