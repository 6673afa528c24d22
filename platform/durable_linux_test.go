//go:build linux

package platform

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFileDurable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i, content := range []string{"first", "second, longer than the first", "3"} {
		if err := WriteFileDurable(dir, "rec.json", []byte(content), 0o666); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		got, err := os.ReadFile(filepath.Join(dir, "rec.json"))
		if err != nil || string(got) != content {
			t.Fatalf("write %d: read %q, %v", i, got, err)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "rec.json"))
	if err != nil || fi.Mode().Perm() != 0o666 {
		// 0666 is what the umask (022 by default) would cut: the write sets the mode exactly.
		t.Fatalf("mode = %v, %v; want exactly 0666 whatever the umask", fi.Mode(), err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("directory holds %v (%v); want only rec.json, no temp leftovers", entries, err)
	}
}

func TestWriteFileDurableRefusesNonRegularTarget(t *testing.T) {
	t.Parallel()
	s := makeSpecials(t)
	for _, name := range []string{"link", "dangling", "fifo", "subdir"} {
		err := WriteFileDurable(s.dir, name, []byte("evil"), 0o600)
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("WriteFileDurable(%s) = %v; want ErrNotRegular", name, err)
		}
	}
	s.checkUntouched(t)
	entries, _ := os.ReadDir(s.dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temp file %s left behind", e.Name())
		}
	}
}

func TestWriteFileDurableRefusesLinkedDir(t *testing.T) {
	t.Parallel()
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileDurable(link, "x", nil, 0o600); err == nil {
		t.Fatal("WriteFileDurable wrote through a linked directory")
	}
	if entries, _ := os.ReadDir(real); len(entries) != 0 {
		t.Fatalf("linked directory got %v", entries)
	}
}
