//go:build linux

package platform

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// maxSunPath is the room for a path in a unix socket address (108 bytes with the NUL).
const maxSunPath = 107

// DialUnix connects to a unix socket. A path too long for a socket address (deep state roots
// and 63-character sandbox ids exceed it) is reached through /proc/self/fd and a handle on its
// directory, opened without following a link.
func DialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= maxSunPath {
		return d.DialContext(ctx, "unix", path)
	}
	dirFD, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	defer unix.Close(dirFD)
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", dirFD, filepath.Base(path)))
}
