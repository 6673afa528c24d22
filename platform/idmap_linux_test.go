//go:build linux

package platform

import (
	"path/filepath"
	"testing"
)

// TestIDRangeLock: a slot taken through one registry is refused to another (a second open
// of the same file, as a second shim has), seen as held, and free again once the holder
// closes its registry.
func TestIDRangeLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "ids.lock")
	a, err := OpenIDRangeLock(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenIDRangeLock(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ok, err := a.TryLock(3); !ok || err != nil {
		t.Fatalf("first TryLock(3) = %v, %v", ok, err)
	}
	if ok, err := b.TryLock(3); ok || err != nil {
		t.Fatalf("a second holder took slot 3: %v, %v", ok, err)
	}
	if held, err := b.Held(3); !held || err != nil {
		t.Fatalf("Held(3) = %v, %v while a holds it", held, err)
	}
	if ok, err := b.TryLock(4); !ok || err != nil {
		t.Fatalf("the neighbouring slot was refused: %v, %v", ok, err)
	}
	a.Close()
	if held, err := b.Held(3); held || err != nil {
		t.Fatalf("Held(3) = %v, %v after its holder closed", held, err)
	}
	if ok, err := b.TryLock(3); !ok || err != nil {
		t.Fatalf("slot 3 was not free after its holder closed: %v, %v", ok, err)
	}
}
