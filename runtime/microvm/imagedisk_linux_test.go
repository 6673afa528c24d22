//go:build linux

package microvm

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMergeLayers merges two layer directories as the image store unpacks them into a stage,
// as overlayfs would show them: a whiteout removes a lower file, an opaque directory hides the
// lower one's entries, a directory replaces a lower link to a host directory without writing
// through it, a file replaces a lower directory, and the image files layer's per-sandbox
// files are left out. It needs root (whiteouts are devices, opaque is a trusted xattr).
func TestMergeLayers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("layers hold devices and trusted xattrs: root only")
	}
	outside := t.TempDir()
	lower, upper, own, stageDir := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(lower, "gone.txt"), "lower")
	write(filepath.Join(lower, "opq/a"), "lower")
	write(filepath.Join(lower, "dir/f"), "lower")
	write(filepath.Join(lower, "kept"), "lower")
	if err := os.Symlink(outside, filepath.Join(lower, "esc")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(upper, "gone.txt"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(upper, "opq/b"), "upper")
	if err := unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("no trusted xattrs here: %v", err)
	}
	write(filepath.Join(upper, "esc/x"), "upper")
	write(filepath.Join(upper, "dir"), "now a file")
	write(filepath.Join(own, "etc/hostname"), "per sandbox")
	write(filepath.Join(own, "etc/passwd"), "user")

	root, err := openDir(unix.AT_FDCWD, stageDir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, l := range []struct {
		dir  string
		skip []string
	}{{lower, nil}, {upper, nil}, {own, perSandboxFiles}} {
		src, err := openDir(unix.AT_FDCWD, l.dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := mergeDir(src, root, "", l.skip); err != nil {
			t.Fatal(err)
		}
		src.Close()
	}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(stageDir, rel))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	for rel, want := range map[string]string{"kept": "lower", "opq/b": "upper", "esc/x": "upper", "dir": "now a file", "etc/passwd": "user"} {
		if got := read(rel); got != want {
			t.Errorf("%s reads %q, want %q", rel, got, want)
		}
	}
	for _, rel := range []string{"gone.txt", "opq/a", "etc/hostname"} {
		if _, err := os.Lstat(filepath.Join(stageDir, rel)); !os.IsNotExist(err) {
			t.Errorf("%s is in the merge: %v", rel, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(stageDir, "esc")); err != nil || !fi.IsDir() {
		t.Errorf("esc is not the upper layer's directory: %v, %v", fi, err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("the merge wrote through the lower layer's link into %s: %v", outside, ents)
	}
}
