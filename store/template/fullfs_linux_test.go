//go:build linux

package template

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// smallFS mounts a tmpfs of size bytes on a fresh directory and returns it; it skips when
// the test cannot mount (not root).
func smallFS(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fill writes into dir/name until the file system is full.
func fill(t *testing.T, dir, name string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// TestOnARealFullFileSystem runs the template store on a small tmpfs: a capture that does not
// fit fails in its copy (the copier's own writes) with storage-full and leaves nothing; once
// the file system is full, a create and a capture answer storage-full and leave nothing, the
// store still reads, and retiring a generation and deleting a template work and free space.
func TestOnARealFullFileSystem(t *testing.T) {
	t.Parallel()
	root := smallFS(t, "512k")
	e := openEnv(t, root)
	gen := e.template(t, "a")
	e.template(t, "b")

	big := t.TempDir()
	if err := os.WriteFile(filepath.Join(big, "big"), make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := e.s.Capture(ctxT(t), "a", big, testKey, nil)
	if errcode.Of(err) != errcode.StorageFull || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a capture larger than the file system = %v; want storage-full wrapping ENOSPC", err)
	}
	noLeftovers := func() {
		t.Helper()
		if gens, err := e.s.Generations("a", e.clock.get()); err != nil || len(gens) != 1 {
			t.Fatalf("Generations = %v, %v; want only %s", gens, err, gen)
		}
		names, _ := os.ReadDir(filepath.Join(e.s.Path(), "a"))
		for _, n := range names {
			if _, ok := platform.IsTempName(n.Name()); ok {
				t.Fatalf("a failed capture left %s", n.Name())
			}
		}
	}
	noLeftovers()

	fill(t, root, "filler")
	_, err = e.s.CreateTemplate(ctxT(t), "c")
	wantCode(t, err, errcode.StorageFull)
	if exists(filepath.Join(e.s.Path(), "c")) {
		t.Fatal("a create on a full file system left the template's directory")
	}
	_, err = e.s.Capture(ctxT(t), "a", smallLayer(t), testKey, nil)
	wantCode(t, err, errcode.StorageFull)
	noLeftovers()

	if out, err := e.s.Retire(ctxT(t), "a", gen, false, e.bindingExists()); err != nil || out != Retired {
		t.Fatalf("Retire on a full file system = %v, %v", out, err)
	}
	if out, err := e.s.DeleteTemplate(ctxT(t), "b", false, e.bindingExists()); err != nil || out != Retired {
		t.Fatalf("DeleteTemplate on a full file system = %v, %v", out, err)
	}
	if err := os.Remove(filepath.Join(root, "filler")); err != nil {
		t.Fatal(err)
	}
	checkRepairs(t, e)
	e.capture(t, "a")
}
