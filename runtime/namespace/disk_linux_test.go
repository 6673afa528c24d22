//go:build linux

package namespace

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/platform"
	"github.com/sandboxd/sandboxd/runtime/namespace/shim"
)

// TestEnsureDiskImage: the image is made once, of the size asked, sparse; a later call keeps it
// as it is (the sandbox's files are in it); a leftover of an interrupted attempt goes.
func TestEnsureDiskImage(t *testing.T) {
	prog, err := mke2fs()
	if err != nil {
		t.Skipf("no mke2fs here: %v", err)
	}
	dir := t.TempDir()
	leftover := filepath.Join(dir, platform.TempName(shim.EntryDiskImage))
	if err := os.WriteFile(leftover, []byte("half made"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ensureDiskImage(ctx, dir, 64, prog); err != nil {
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
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Fatalf("the leftover of an interrupted attempt is still there: %v", err)
	}
	before := fi.Sys().(*syscall.Stat_t).Ino
	if err := ensureDiskImage(ctx, dir, 128, prog); err != nil {
		t.Fatal(err)
	}
	fi, err = os.Stat(img)
	if err != nil || fi.Sys().(*syscall.Stat_t).Ino != before || fi.Size() != 64<<20 {
		t.Fatalf("a second call replaced the image: %v %v", fi, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("the directory holds %d entries, want the image alone", len(ents))
	}
}
