//go:build linux

package namespace

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// TestEnsureDiskImage: the image is made once, of the size asked, sparse, an ext4 file system
// with the template's content; a later call keeps it as it is (the sandbox's files are in
// it) without asking for a template; a leftover of an interrupted attempt goes.
func TestEnsureDiskImage(t *testing.T) {
	prog, err := mke2fs()
	if err != nil {
		t.Skipf("no mke2fs here: %v", err)
	}
	r := &Runtime{}
	parent := t.TempDir()
	dir := filepath.Join(parent, "sb")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(dir, platform.TempName(shim.EntryDiskImage))
	if err := os.WriteFile(leftover, []byte("half made"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	asked := 0
	template := func(sizeMB int) func() (*os.File, error) {
		return func() (*os.File, error) {
			asked++
			return r.diskTemplate(ctx, dir, sizeMB, prog)
		}
	}
	if err := ensureDiskImage(dir, 64, template(64)); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, shim.EntryDiskImage)
	fi, err := os.Stat(img)
	if err != nil || fi.Size() != 64<<20 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("image %v %v, want 64 MiB, mode 0600", fi, err)
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 16<<20 {
		t.Fatalf("the fresh image takes %d bytes of the host's disk: not sparse", used)
	}
	b, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	// The ext4 superblock sits at 1024, its magic 0xEF53 at offset 56 in it.
	if magic := binary.LittleEndian.Uint16(b[1024+56:]); magic != 0xEF53 {
		t.Fatalf("the image holds no ext4 file system (magic %#x)", magic)
	}
	tmpl, err := r.diskTemplate(ctx, dir, 64, prog)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 64<<20)
	if _, err := tmpl.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}
	tmpl.Close()
	if !bytes.Equal(b, want) {
		t.Fatal("the image differs from its template")
	}
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Fatalf("the leftover of an interrupted attempt is still there: %v", err)
	}
	before := fi.Sys().(*syscall.Stat_t).Ino
	asked = 0
	if err := ensureDiskImage(dir, 128, template(128)); err != nil {
		t.Fatal(err)
	}
	fi, err = os.Stat(img)
	if err != nil || fi.Sys().(*syscall.Stat_t).Ino != before || fi.Size() != 64<<20 || asked != 0 {
		t.Fatalf("a second call replaced the image or made a template (%d): %v %v", asked, fi, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("the directory holds %d entries, want the image alone", len(ents))
	}
	// The templates are unnamed: nothing of them shows in the directory they live in.
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		t.Fatalf("the templates' directory holds %d entries, want the sandbox's alone", len(ents))
	}
}

// TestDiskTemplateEviction: the cache keeps maxDiskTemplates, evicting the oldest, and a
// template handed out stays readable after it was evicted.
func TestDiskTemplateEviction(t *testing.T) {
	prog, err := mke2fs()
	if err != nil {
		t.Skipf("no mke2fs here: %v", err)
	}
	r := &Runtime{}
	parent := t.TempDir()
	ctx := context.Background()
	first, err := r.diskTemplate(ctx, filepath.Join(parent, "sb"), 8, prog)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	for size := 9; size < 9+maxDiskTemplates; size++ {
		f, err := r.diskTemplate(ctx, filepath.Join(parent, "sb"), size, prog)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if n := len(r.diskTemplates); n != maxDiskTemplates {
		t.Fatalf("the cache holds %d templates, want %d", n, maxDiskTemplates)
	}
	if _, ok := r.diskTemplates[diskTemplateKey{parent, 8}]; ok {
		t.Fatal("the oldest template was not evicted")
	}
	sb := make([]byte, 2)
	if _, err := first.ReadAt(sb, 1024+56); err != nil || binary.LittleEndian.Uint16(sb) != 0xEF53 {
		t.Fatalf("a template handed out no longer reads as ext4 once evicted: %v %x", err, sb)
	}
}

// TestUnlinkedFile: the template's fallback where O_TMPFILE is missing is a file whose name
// is gone at once, so nothing of it shows in the sandbox's directory.
func TestUnlinkedFile(t *testing.T) {
	dir := t.TempDir()
	f, err := unlinkedFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("x"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the directory holds %d entries, want none", len(ents))
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Nlink != 0 {
		t.Fatalf("the file has %d links (%v), want 0", st.Nlink, err)
	}
}
