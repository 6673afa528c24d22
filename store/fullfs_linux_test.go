//go:build linux

package store

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

// TestOnARealFullFileSystem runs the sandbox store on a full tmpfs: a provision answers
// storage-full and leaves the id free, reads and lists work, and a delete works.
func TestOnARealFullFileSystem(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	root := t.TempDir()
	if err := syscall.Mount("tmpfs", root, "tmpfs", 0, "size=256k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(root, syscall.MNT_DETACH) })
	s := openStore(t, root)
	provision(t, s, "a")
	populate(t, filepath.Join(root, SandboxesDir, "a"))

	f, err := os.Create(filepath.Join(root, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = f.Write(make([]byte, 64<<10))
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the file system: %v", err)
	}

	l, err := s.LockForProvision(timeout(t, 5*time.Second), "b")
	if err == nil {
		err = l.WriteConfig(config("b"))
		l.Unlock()
	}
	if errcode.Of(err) != errcode.StorageFull || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a provision on a full file system = %v; want storage-full wrapping ENOSPC", err)
	}
	if exists(filepath.Join(root, SandboxesDir, "b")) {
		t.Fatalf("the failed provision left its state directory: %v", entriesOf(t, filepath.Join(root, SandboxesDir, "b")))
	}
	if ids, err := s.List(); err != nil || len(ids) != 1 {
		t.Fatalf("List on a full file system = %v, %v", ids, err)
	}
	if _, err := s.ReadConfigUnlocked("a"); err != nil {
		t.Fatalf("a read on a full file system: %v", err)
	}
	l = lockExisting(t, s, "a")
	if err := l.Deprovision(timeout(t, 5*time.Second)); err != nil {
		t.Fatalf("a delete on a full file system: %v", err)
	}
	if exists(filepath.Join(root, SandboxesDir, "a")) {
		t.Fatal("the deleted sandbox's directory remains")
	}
}
