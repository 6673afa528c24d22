//go:build linux

package microvm

import (
	"os"
	"syscall"
)

// ownedByUs says whether the /proc directory st (whose owner is the process's effective uid)
// belongs to this process's effective user.
func ownedByUs(st os.FileInfo) bool {
	s, ok := st.Sys().(*syscall.Stat_t)
	return ok && int(s.Uid) == os.Geteuid()
}
