//go:build linux

package microvm

import (
	"testing"

	"github.com/sandboxd/sandboxd/runtime/microvm/shim"
)

// TestOverlayDirOfQEMUArgs: the orphan QEMU search reads the state directory back from the
// command line that shim.QEMUArgs writes (a comma in the path doubled), and only below the
// state root; a change of the drive's option that it no longer reads fails here.
func TestOverlayDirOfQEMUArgs(t *testing.T) {
	const root = "/srv/sandboxd,root"
	dir := root + "/sandboxes/a,b"
	args := shim.QEMUArgs(&shim.Config{Accel: "tcg", Kernel: "k", Initramfs: "i", Overlay: dir + "/" + shim.EntryOverlay}, false)
	argv := make([][]byte, len(args))
	for i, a := range args {
		argv[i] = []byte(a)
	}
	if got, ok := overlayDir(argv, root); !ok || got != dir {
		t.Fatalf("overlayDir of QEMU's arguments: %q, %v; want %q", got, ok, dir)
	}
	if _, ok := overlayDir(argv, "/srv/other"); ok {
		t.Fatal("a QEMU of another state root is taken for this one's")
	}
	probe := shim.QEMUArgs(&shim.Config{Accel: "tcg", Kernel: "k", Initramfs: "i"}, true)
	pargv := make([][]byte, len(probe))
	for i, a := range probe {
		pargv[i] = []byte(a)
	}
	if _, ok := overlayDir(pargv, root); ok {
		t.Fatal("the probe guest (no disk) is taken for a sandbox's QEMU")
	}
}
