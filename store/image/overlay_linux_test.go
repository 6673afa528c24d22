//go:build linux

package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLayersStackAsOverlay mounts two pulled layers as an overlay, as a sandbox's root
// will, and checks that the whiteouts unpacking made are ones overlayfs honours: a
// whited-out file is gone, an opaque directory hides the base's entries, the rest of the
// base shows through.
func TestLayersStackAsOverlay(t *testing.T) {
	needRoot(t)
	t.Parallel()
	base := tarOf(t, dir("etc/"), file("etc/keep", "kept"), file("etc/gone", "x"),
		dir("cache/"), file("cache/old", "x"), file("cache/older", "x"))
	top := tarOf(t, file("etc/.wh.gone", ""), dir("cache/"), file("cache/.wh..wh..opq", ""), file("cache/new", "n"))
	s, _ := openStore(t, Options{Fetcher: &fakeFetcher{layers: [][]byte{base, top}}})
	if _, err := s.Pull(ctxT(t), "example.com/stack:1", "stack", nil); err != nil {
		t.Fatal(err)
	}
	dirs, err := s.LayerDirs("stack")
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	opts := "lowerdir=" + strings.Join(dirs, ":")
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
			t.Skipf("overlayfs is not available here (%v)", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	if b, err := os.ReadFile(filepath.Join(mnt, "etc/keep")); err != nil || string(b) != "kept" {
		t.Errorf("etc/keep = %q, %v; want the base's file", b, err)
	}
	if _, err := os.Lstat(filepath.Join(mnt, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("etc/gone: %v; want it whited out", err)
	}
	entries, err := os.ReadDir(filepath.Join(mnt, "cache"))
	if err != nil || len(entries) != 1 || entries[0].Name() != "new" {
		t.Errorf("cache holds %v (%v); want only new, the opaque directory hiding the base's", entries, err)
	}
}
