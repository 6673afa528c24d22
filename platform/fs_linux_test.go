//go:build linux

package platform

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// failAt returns an FS whose Fault fails the nth call (counting from 1) with errno, and a
// function that says how many calls were made.
func failAt(n int, errno error) (FS, func() []Op) {
	var ops []Op
	return FS{Fault: func(op Op, path string) error {
		ops = append(ops, op)
		if len(ops) == n {
			return errno
		}
		return nil
	}}, func() []Op { return ops }
}

// TestFSWriteFileDurableAtFaults fails each step of a durable write in turn: the record is
// then either the old content or the new, never a mix, no temp file stays behind (unless the
// removal of the temp file is the step that fails), and the errno reaches the caller.
func TestFSWriteFileDurableAtFaults(t *testing.T) {
	t.Parallel()
	{
		dir := t.TempDir()
		d, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		count, list := failAt(0, nil)
		if err := count.WriteFileDurableAt(d, "rec", []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		d.Close()
		want := []Op{OpCreate, OpWrite, OpSync, OpRename, OpSync}
		if got := list(); !slices.Equal(got, want) {
			t.Fatalf("a durable write made %v, want %v", got, want)
		}
	}
	for n := 1; n <= 5; n++ {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "rec"), []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		f, list := failAt(n, syscall.ENOSPC)
		err = f.WriteFileDurableAt(d, "rec", []byte("new"), 0o600)
		d.Close()
		op := list()[n-1]
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("failing %s (step %d): err = %v, want ENOSPC", op, n, err)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "rec"))
		// Only the directory's fsync comes after the rename.
		want := "old"
		if n == 5 {
			want = "new"
		}
		if string(got) != want {
			t.Fatalf("failing %s (step %d): the record reads %q, want %q", op, n, got, want)
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Fatalf("failing %s (step %d): the directory holds %v, want only the record", op, n, entries)
		}
	}
}

func TestFSRemoveAllAt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "kept")
	if err := os.WriteFile(outside, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	for _, p := range []string{"a/b/c", "ro"} {
		if err := os.MkdirAll(filepath.Join(tree, p), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "a/b/c/f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "ro/f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(tree, "a/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(tree, "ro"), 0o500); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	// A fault stops the removal where it happens and reaches the caller.
	f := FS{Fault: func(op Op, path string) error {
		if op == OpUnlink && strings.HasSuffix(path, "/c/f") {
			return syscall.EIO
		}
		return nil
	}}
	if err := f.RemoveAllAt(d, "tree"); !errors.Is(err, syscall.EIO) {
		t.Fatalf("RemoveAllAt with a failing unlink = %v, want EIO", err)
	}
	if _, err := os.Lstat(filepath.Join(tree, "a/b/c/f")); err != nil {
		t.Fatalf("the entry whose unlink failed is gone: %v", err)
	}

	if err := (FS{}).RemoveAllAt(d, "tree"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(tree); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the tree is still there: %v", err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("the removal followed a link: %v", err)
	}
	if err := (FS{}).RemoveAllAt(d, "tree"); err != nil {
		t.Fatalf("removing a missing entry: %v", err)
	}
}

func TestFSRenameNoReplaceAt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, n := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := (FS{}).RenameNoReplaceAt(d, "a", "b"); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("rename over an existing entry = %v, want ErrExist", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "b")); string(got) != "b" {
		t.Fatalf("b was replaced: %q", got)
	}
	if err := (FS{}).RenameNoReplaceAt(d, "a", "c"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "c")); string(got) != "a" {
		t.Fatalf("c reads %q", got)
	}
}

// dirWithRecord makes a directory holding the record "rec" ("old content", mode 0644) and
// opens it for the test.
func dirWithRecord(t *testing.T) (string, *os.File) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rec"), []byte("old content"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return dir, d
}

// wantNewRecord checks that dir's record reads "new" with mode 0600 exactly.
func wantNewRecord(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "rec"))
	fi, serr := os.Stat(filepath.Join(dir, "rec"))
	if err != nil || serr != nil || string(b) != "new" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("after the write: %q %v, mode %v %v", b, err, fi.Mode(), serr)
	}
}

// TestFSWriteFileWholeAt: a whole write syncs the new file's content before the rename and
// not the directory after it, and replaces the record as a durable write does.
func TestFSWriteFileWholeAt(t *testing.T) {
	t.Parallel()
	dir, d := dirWithRecord(t)
	count, list := failAt(0, nil)
	if err := count.WriteFileWholeAt(d, "rec", []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if want := []Op{OpCreate, OpWrite, OpSync, OpRename}; !slices.Equal(list(), want) {
		t.Fatalf("a whole write made %v, want %v", list(), want)
	}
	wantNewRecord(t, dir)
	// A failed content sync leaves the old record and no temp file.
	f, _ := failAt(3, syscall.EIO)
	if err := f.WriteFileWholeAt(d, "rec", []byte("newer"), 0o600); !errors.Is(err, syscall.EIO) {
		t.Fatalf("failing the content's fsync: err = %v, want EIO", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "rec")); string(b) != "new" {
		t.Fatalf("after a failed whole write the record reads %q, want the old content", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("the directory holds %d entries, want the record alone", len(ents))
	}
}

// TestFSWriteFileAtomicAt: an atomic write makes the steps of a durable one but its two
// fsyncs, replaces the old content whole, sets the mode exactly, and refuses a target that is
// not a regular file.
func TestFSWriteFileAtomicAt(t *testing.T) {
	t.Parallel()
	dir, d := dirWithRecord(t)
	count, list := failAt(0, nil)
	if err := count.WriteFileAtomicAt(d, "rec", []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if want := []Op{OpCreate, OpWrite, OpRename}; !slices.Equal(list(), want) {
		t.Fatalf("an atomic write made %v, want %v", list(), want)
	}
	wantNewRecord(t, dir)
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("the directory holds %d entries, want the record alone", len(ents))
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomicAt(d, "sub", []byte("x"), 0o600); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("an atomic write over a directory: %v, want ErrNotRegular", err)
	}
}
