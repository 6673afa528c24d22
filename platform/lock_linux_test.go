//go:build linux

package platform

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// openLockFile opens path (made if missing) for a lock, closed when the test ends.
func openLockFile(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestTryLockExcludesOtherOpens(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lock")
	open := func() *os.File { return openLockFile(t, path) }
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

// LockWithin waits for a holder to let go, and gives up with ErrLockHeld once its time is up.
func TestLockWithinWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lock")
	open := func() *os.File { return openLockFile(t, path) }
	holder, waiter, reader := open(), open(), open()
	if ok, err := TryLock(holder); !ok || err != nil {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	if err := LockWithin(reader, false, 0, nil); !errors.Is(err, ErrLockHeld) {
		t.Fatalf("a shared lock beside an exclusive holder, no time to wait: %v, want ErrLockHeld", err)
	}
	waited := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		got <- LockWithin(waiter, true, time.Minute, func() { close(waited) })
	}()
	<-waited // it found the lock held and pauses
	select {
	case err := <-got:
		t.Fatalf("LockWithin returned %v while the holder still holds the lock", err)
	default:
	}
	holder.Close()
	if err := <-got; err != nil {
		t.Fatalf("LockWithin after the holder let go: %v", err)
	}
	if ok, err := TryLock(open()); ok || err != nil {
		t.Fatalf("the waiter's lock does not exclude another open: %v, %v", ok, err)
	}
}
