//go:build !linux

package platform

import (
	"context"
	"net"
	"os"
)

// DialUnix is unsupported: bothyd runs only on Linux; the stub keeps the module building.
func DialUnix(ctx context.Context, path string) (net.Conn, error) { return nil, ErrUnsupported }

func ListenUnix(path string, perm os.FileMode) (*os.File, error) { return nil, ErrUnsupported }
func DialUnixNoFollow(ctx context.Context, path string) (net.Conn, error) {
	return nil, ErrUnsupported
}
func PeerCred(conn net.Conn) (pid, uid, gid int, err error)     { return 0, 0, 0, ErrUnsupported }
func ReceivedFiles(oob []byte, name string) ([]*os.File, error) { return nil, ErrUnsupported }
