//go:build linux

package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/microvm/qmp"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

// errNoMonitor is a sandbox whose QEMU has no monitor socket: it does not run (or was started
// by a build without one), so it is neither stopped nor can be.
var errNoMonitor = errors.New("microvm runtime: the VM has no monitor socket")

// qmpPath is the monitor socket of the sandbox in dir.
func qmpPath(dir string) string { return filepath.Join(dir, shim.EntryControl, shim.QMPName) }

// dialQMP connects to the monitor of the sandbox in dir, which the shim's QEMU listens on in
// the control directory, where nothing inside the guest reaches. The socket is reached
// without following links and its listener must be of this user (QEMU runs as the shim's).
func dialQMP(ctx context.Context, dir string) (*qmp.Conn, error) {
	conn, err := platform.DialUnixNoFollow(ctx, qmpPath(dir))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ECONNREFUSED) {
		return nil, errNoMonitor
	}
	if err != nil {
		return nil, fmt.Errorf("microvm runtime: the monitor: %w", err)
	}
	if _, uid, _, err := platform.PeerCred(conn); err != nil || uid != os.Geteuid() {
		conn.Close()
		return nil, fmt.Errorf("microvm runtime: the monitor's listener is uid %d (%v), not this user", uid, err)
	}
	return qmp.New(ctx, conn)
}
