//go:build linux

package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLinkLayerKeepsOverlayMarks: a linked layer shares its files' inodes with the source
// and keeps what overlayfs reads from a layer: whiteouts, opaque directories, links, modes.
func TestLinkLayerKeepsOverlayMarks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts and trusted.* xattrs need root; CI runs as root")
	}
	t.Parallel()
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "opaque/sub"), 0o750))
	must(unix.Setxattr(filepath.Join(src, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(src, "opaque/sub/f"), []byte("data"), 0o640))
	must(unix.Mknod(filepath.Join(src, "gone"), unix.S_IFCHR, 0))
	must(os.Symlink("/etc/passwd", filepath.Join(src, "link")))
	must(os.Chown(filepath.Join(src, "opaque/sub"), 1000, 1000))
	dst := filepath.Join(t.TempDir(), "copy")
	must(LinkLayer(src, dst))

	var a, b unix.Stat_t
	must(unix.Stat(filepath.Join(src, "opaque/sub/f"), &a))
	must(unix.Stat(filepath.Join(dst, "opaque/sub/f"), &b))
	if a.Ino != b.Ino || b.Nlink != 2 {
		t.Fatalf("the file was not hard-linked: inodes %d and %d, %d links", a.Ino, b.Ino, b.Nlink)
	}
	buf := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("the opaque mark was not kept: %q %v", buf[:n], err)
	}
	must(unix.Lstat(filepath.Join(dst, "gone"), &b))
	if b.Mode&unix.S_IFMT != unix.S_IFCHR || b.Rdev != 0 {
		t.Fatalf("the whiteout is not a 0/0 character device: mode %o rdev %d", b.Mode, b.Rdev)
	}
	if target, err := os.Readlink(filepath.Join(dst, "link")); err != nil || target != "/etc/passwd" {
		t.Fatalf("the symbolic link reads %q, %v", target, err)
	}
	must(unix.Lstat(filepath.Join(dst, "opaque/sub"), &b))
	if b.Uid != 1000 || b.Mode&0o7777 != 0o750 {
		t.Fatalf("the directory's owner and mode are %d %o; want 1000 750", b.Uid, b.Mode&0o7777)
	}
}

// TestForkPointAndAdopt: a fork adopts the source's files at the point; the source's later
// writes are not the fork's, and the fork's are not the source's.
func TestForkPointAndAdopt(t *testing.T) {
	t.Parallel()
	for _, running := range []bool{false, true} {
		src := newSandbox(t, map[string]string{"f": "before"})
		if _, err := src.Rotate("base", Limits{}); err != nil {
			t.Fatal(err)
		}
		writeUpper(t, src, map[string]string{"g": "on top"})
		layers, _, done, err := src.Point(context.Background(), running, noHold)
		if err != nil {
			t.Fatal(err)
		}
		fork := &Sandbox{Dir: t.TempDir()}
		if err := fork.Adopt(layers); err != nil {
			t.Fatal(err)
		}
		done()
		writeUpper(t, src, map[string]string{"f": "source after"})
		writeUpper(t, fork, map[string]string{"h": "fork only"})
		if got := view(t, fork); !equal(got, map[string]string{"f": "before", "g": "on top", "h": "fork only"}) {
			t.Fatalf("running %v: the fork sees %v", running, got)
		}
		if got := view(t, src); !equal(got, map[string]string{"f": "source after", "g": "on top"}) {
			t.Fatalf("running %v: the source sees %v", running, got)
		}
		if p, err := src.Problems(); err != nil || len(p) != 0 {
			t.Fatalf("running %v: the source's problems after the fork: %v %v", running, p, err)
		}
	}
}
