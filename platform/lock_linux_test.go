//go:build linux

package platform

import (
	"os"
	"path/filepath"
	"testing"
)

func TestTryLockExcludesOtherOpens(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lock")
	open := func() *os.File {
		f, err := OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	a, b := open(), open()
	if ok, err := TryLock(a); !ok || err != nil {
		t.Fatalf("first TryLock = %v, %v", ok, err)
	}
	// flock belongs to the open file description: a second open in the same process conflicts.
	if ok, err := TryLock(b); ok || err != nil {
		t.Fatalf("TryLock while held = %v, %v; want false, nil", ok, err)
	}
	if err := Unlock(a); err != nil {
		t.Fatal(err)
	}
	if ok, err := TryLock(b); !ok || err != nil {
		t.Fatalf("TryLock after Unlock = %v, %v", ok, err)
	}
	// Closing releases the lock as well, as a crash does.
	b.Close()
	if ok, err := TryLock(open()); !ok || err != nil {
		t.Fatalf("TryLock after close = %v, %v", ok, err)
	}
}
