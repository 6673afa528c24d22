//go:build linux

package registry

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

func syscallMknodWhiteout(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o600, 0) }

func setxattr(p, k, v string) error { return unix.Lsetxattr(p, k, []byte(v), 0) }

func getxattr(p, k string) (string, bool) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, k, buf)
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}

func statOf(fi os.FileInfo) string {
	st := fi.Sys().(*syscall.Stat_t)
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}
