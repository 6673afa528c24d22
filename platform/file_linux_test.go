//go:build linux

package platform

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// special creates, in dir, entries of every kind that a regular-file open must refuse, each
// with a target or content that the test can check afterwards.
type specials struct {
	dir, target string
}

func makeSpecials(t *testing.T) specials {
	t.Helper()
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "missing"), filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "subdir"), 0o700); err != nil {
		t.Fatal(err)
	}
	return specials{dir: dir, target: target}
}

func (s specials) checkUntouched(t *testing.T) {
	t.Helper()
	if got, err := os.ReadFile(s.target); err != nil || string(got) != "precious" {
		t.Errorf("link target changed: %q, %v", got, err)
	}
	if _, err := os.Lstat(filepath.Join(s.dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dangling link's target was created: %v", err)
	}
	for name, typ := range map[string]fs.FileMode{"link": fs.ModeSymlink, "dangling": fs.ModeSymlink, "fifo": fs.ModeNamedPipe, "subdir": fs.ModeDir} {
		fi, err := os.Lstat(filepath.Join(s.dir, name))
		if err != nil || fi.Mode().Type() != typ {
			t.Errorf("%s changed: %v, %v", name, fi, err)
		}
	}
}

func openDir(t *testing.T, path string) *os.File {
	t.Helper()
	d, err := OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestOpenFileAtRefusesNonRegular(t *testing.T) {
	t.Parallel()
	s := makeSpecials(t)
	d := openDir(t, s.dir)
	flags := map[string]int{
		"read":         os.O_RDONLY,
		"write":        os.O_WRONLY,
		"create":       os.O_RDWR | os.O_CREATE,
		"create-trunc": os.O_WRONLY | os.O_CREATE | os.O_TRUNC,
	}
	for _, name := range []string{"link", "dangling", "fifo", "subdir"} {
		for fname, flag := range flags {
			// A blocking open of the FIFO would hang the test here: O_NONBLOCK is what keeps it fast.
			f, err := OpenFileAt(d, name, flag, 0o600)
			if err == nil {
				f.Close()
				t.Errorf("OpenFileAt(%s, %s) succeeded", name, fname)
				continue
			}
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("OpenFileAt(%s, %s) = %v; want ErrNotRegular", name, fname, err)
			}
		}
		if _, err := ReadFileAt(d, name, 100); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFileAt(%s) = %v; want ErrNotRegular", name, err)
		}
		if _, err := ReadFile(filepath.Join(s.dir, name), 100); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFile(%s) = %v; want ErrNotRegular", name, err)
		}
	}
	s.checkUntouched(t)
}

func TestOpenFileAtRegular(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := openDir(t, dir)
	f, err := OpenFileAt(d, "new", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, err := IDOf(f)
	if err != nil {
		t.Fatal(err)
	}
	st, err := LstatAt(d, "new")
	if err != nil || st.ID != a || !st.IsRegular() || st.UID != uint32(os.Geteuid()) {
		t.Fatalf("LstatAt = %+v, %v; want regular file with id %+v", st, err, a)
	}
	// A replaced entry has another identity: this is how lock holders notice replacement.
	if err := os.Remove(filepath.Join(dir, "new")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	st2, err := LstatAt(d, "new")
	if err != nil || st2.ID == a {
		t.Fatalf("replaced file kept identity %+v (err %v)", st2.ID, err)
	}
	if _, err := LstatAt(d, "absent"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("LstatAt(absent) = %v; want not-exist", err)
	}
}

func TestPlainNamesOnly(t *testing.T) {
	t.Parallel()
	d := openDir(t, t.TempDir())
	for _, name := range []string{"", ".", "..", "a/b", "../x", "/etc/passwd"} {
		if _, err := OpenFileAt(d, name, os.O_RDONLY, 0); err == nil {
			t.Errorf("OpenFileAt(%q) succeeded", name)
		}
		if err := UnlinkAt(d, name); err == nil {
			t.Errorf("UnlinkAt(%q) succeeded", name)
		}
		if _, err := LstatAt(d, name); err == nil {
			t.Errorf("LstatAt(%q) succeeded", name)
		}
	}
}

func TestReadFileBounded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := openDir(t, dir)
	data := bytes.Repeat([]byte("x"), 100)
	if err := os.WriteFile(filepath.Join(dir, "f"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadFileAt(d, "f", 100); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadFileAt at the bound = %d bytes, %v", len(got), err)
	}
	if _, err := ReadFileAt(d, "f", 99); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ReadFileAt over the bound = %v; want ErrTooLarge", err)
	}
}

func TestOpenDirRefusesLink(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if d, err := OpenDir(filepath.Join(dir, "link")); err == nil {
		d.Close()
		t.Fatal("OpenDir followed a link")
	}
	parent := openDir(t, dir)
	if d, err := OpenDirAt(parent, "link"); err == nil {
		d.Close()
		t.Fatal("OpenDirAt followed a link")
	}
	d, err := OpenDirAt(parent, "real")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := MkdirAt(d, "sub", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAt(d, "sub", 0o700); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second MkdirAt = %v; want exist", err)
	}
	names, err := ReadDirNames(d)
	if err != nil || len(names) != 1 || names[0] != "sub" {
		t.Fatalf("ReadDirNames = %v, %v", names, err)
	}
	// Listing twice must list the same: it does not consume the handle's offset.
	if names, err := ReadDirNames(d); err != nil || len(names) != 1 {
		t.Fatalf("second ReadDirNames = %v, %v", names, err)
	}
	if err := RmdirAt(d, "sub"); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(d); err != nil {
		t.Fatal(err)
	}
}

// TestListDir: the names come sorted, without . and ..; a directory named through a final
// link is refused, and a missing one is fs.ErrNotExist.
func TestListDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, n := range []string{"b", "a", "c"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	names, err := ListDir(dir)
	if err != nil || !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Fatalf("ListDir = %v, %v; want [a b c]", names, err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if _, err := ListDir(link); err == nil {
		t.Fatal("a directory named through a final link was listed")
	}
	if _, err := ListDir(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing directory: %v, want fs.ErrNotExist", err)
	}
}
