//go:build linux

package platform

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMkdirAllInRootStaysInside: links planted in a tree, absolute or through "..", lead
// nowhere outside it; what MkdirAllInRoot, MakeFileInRoot and SymlinkInRoot make through
// them lands inside the root, and nothing appears in the directory the links name.
func TestMkdirAllInRootStaysInside(t *testing.T) {
	t.Parallel()
	outside := t.TempDir()
	root := t.TempDir()
	for name, target := range map[string]string{
		"abs":    outside,
		"up":     "../../../../../../../../" + outside,
		"dotdot": "..",
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	rootf, err := OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer rootf.Close()
	for _, p := range []string{"abs/x/y", "up/x", "/dotdot/dotdot/z", "../../w"} {
		d, err := MkdirAllInRoot(rootf, p, 0o755)
		if err != nil {
			// A link that resolves to a directory that does not exist inside the root is
			// an error; an escape would not be.
			t.Logf("MkdirAllInRoot(%q): %v", p, err)
			continue
		}
		d.Close()
	}
	if f, err := MakeFileInRoot(rootf, "abs/file", 0o644); err == nil {
		f.Close()
	}
	_ = SymlinkInRoot(rootf, "abs/link", "/etc")
	ents, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("making through planted links reached the directory they point to: %v", ents)
	}
	// The paths that a root-confined walk makes of them do exist inside.
	for _, p := range []string{"z", "w"} {
		if fi, err := os.Lstat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
			t.Errorf("%s was not made inside the root: %v", p, err)
		}
	}
}

// TestMkdirAllInRootFollowsInside: a link that stays inside the root is followed, the way it
// would be once the root is "/".
func TestMkdirAllInRootFollowsInside(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "var/run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/var/run", filepath.Join(root, "run")); err != nil {
		t.Fatal(err)
	}
	rootf, err := OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer rootf.Close()
	d, err := MkdirAllInRoot(rootf, "/run/a/b", 0o700)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if fi, err := os.Stat(filepath.Join(root, "var/run/a/b")); err != nil || fi.Mode().Perm()&0o077 != 0 || !fi.IsDir() {
		t.Fatalf("var/run/a/b: %v %v", fi, err)
	}
	f, err := MakeFileInRoot(rootf, "run/a/node", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A final link is never followed for a file: MakeFileInRoot refuses it.
	if err := os.Symlink("/var/run/a/node", filepath.Join(root, "var/run/a/lnk")); err != nil {
		t.Fatal(err)
	}
	if _, err := MakeFileInRoot(rootf, "run/a/lnk", 0o644); err == nil {
		t.Fatal("MakeFileInRoot followed a final link")
	}
	if err := SymlinkInRoot(rootf, "run/a/sl", "pts/ptmx"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(filepath.Join(root, "var/run/a/sl")); err != nil || got != "pts/ptmx" {
		t.Fatalf("readlink = %q, %v", got, err)
	}
	if _, err := OpenInRoot(rootf, "run/a/missing", unix.O_PATH); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenInRoot of a missing file: %v", err)
	}
}
