//go:build linux

package platform

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNewOverlayLayers: an overlay made either way shows its lowers merged, top first, and
// writes to its upper; the paths way names each layer by /proc/self/fd/<n>, its layers' mount
// attached in a namespace of its own (WithMountsAttached), and the overlay outlives that.
func TestNewOverlayLayers(t *testing.T) {
	needRoot(t)
	for _, how := range []OverlayLayers{OverlayLayersByFD, OverlayLayersByPath} {
		t.Run(string(how), func(t *testing.T) {
			if how == OverlayLayersByFD && !kernelTakesLayerFDs() {
				t.Skip("this kernel takes no overlay layers as descriptors (Linux 6.13)")
			}
			m, err := NewMount("tmpfs", "test", "size=64k,mode=0700", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			dirs := map[string]*os.File{}
			for _, name := range []string{"top", "bottom", "upper", "work"} {
				if err := MkdirAt(m, name, 0o755); err != nil {
					t.Fatal(err)
				}
				if dirs[name], err = OpenDirAt(m, name); err != nil {
					t.Fatal(err)
				}
				defer dirs[name].Close()
			}
			for dir, content := range map[string]string{"top": "top", "bottom": "bottom"} {
				for _, name := range []string{dir, "both"} {
					f, err := OpenFileAt(dirs[dir], name, os.O_WRONLY|os.O_CREATE, 0o644)
					if err != nil {
						t.Fatal(err)
					}
					_, _ = f.WriteString(content)
					f.Close()
				}
			}
			var ov *os.File
			mk := func() error {
				var err error
				ov, err = NewOverlay(how, []*os.File{dirs["top"], dirs["bottom"]}, dirs["upper"], dirs["work"], "index=off", 0)
				return err
			}
			if how == OverlayLayersByPath {
				// As the shim does: before 6.15 no layer may be on a detached mount.
				err = WithMountsAttached([]*os.File{m}, t.TempDir(), mk)
			} else {
				err = mk()
			}
			if err != nil {
				t.Fatal(err)
			}
			defer ov.Close()
			for name, want := range map[string]string{"top": "top", "bottom": "bottom", "both": "top"} {
				b, err := ReadFileAt(ov, name, 64)
				if err != nil || string(b) != want {
					t.Fatalf("%s reads %q (%v), want %q", name, b, err, want)
				}
			}
			f, err := OpenFileAt(ov, "new", os.O_WRONLY|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			if _, err := LstatAt(dirs["upper"], "new"); err != nil {
				t.Fatalf("a file made in the overlay is not in its upper: %v", err)
			}
		})
	}
}

// kernelTakesLayerFDs says whether overlayfs takes "lowerdir+" descriptors here.
func kernelTakesLayerFDs() bool {
	var u unix.Utsname
	_ = unix.Uname(&u)
	var major, minor int
	_, _ = fmt.Sscanf(strings.TrimRight(string(u.Release[:]), "\x00"), "%d.%d", &major, &minor)
	return major > 6 || major == 6 && minor >= 13
}

// TestWithMountsAttachedStaysPrivate: a clone of a shared mount, attached by
// WithMountsAttached with another mount stacked on it, leaves nothing in this mount
// namespace: the clone, a peer of the shared mount, would otherwise propagate the stacked
// mount to it. Without making each mount private first, the stacked tmpfs showed on the
// shared mount's directory (as a sandbox's disk did on Debian 12's host base).
func TestWithMountsAttachedStaysPrivate(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	clone, err := CloneMount(nil, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer clone.Close()
	top, err := NewMount("tmpfs", "stacked", "size=16k", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	if err := WithMountsAttached([]*os.File{clone, top}, t.TempDir(), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	mounts, err := MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) > 1 {
		t.Fatalf("mounts under the shared directory after the attachment: %v", mounts)
	}
}
