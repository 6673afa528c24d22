//go:build linux

package shim

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAllocateIDsSkipsSubordinateRanges: a slot that /etc/subuid-style ranges overlap is
// never handed out, and slots go to one holder at a time.
func TestAllocateIDsSkipsSubordinateRanges(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "subuid")
	if err := os.WriteFile(sub, []byte("alice:100000:65536\nbob:200000:10\n# junk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spans := subordinateRanges(sub, filepath.Join(dir, "missing"))
	if len(spans) != 2 {
		t.Fatalf("spans %v, want 2", spans)
	}
	if !overlaps(spans, 160000, 170000) || !overlaps(spans, 200009, 300000) || overlaps(spans, 165536, 200000) {
		t.Fatalf("overlaps wrong for %v", spans)
	}
	c := IDConfig{Base: 1 << 30, Slots: 2, Registry: filepath.Join(dir, "ids.lock")}
	a, err := allocateIDs(c)
	if err != nil {
		t.Fatal(err)
	}
	defer a.release()
	b, err := allocateIDs(c)
	if err != nil {
		t.Fatal(err)
	}
	defer b.release()
	if a.slot == b.slot || a.base == b.base {
		t.Fatalf("two holders share slot %d", a.slot)
	}
	if _, err := allocateIDs(c); err == nil {
		t.Fatal("a third holder got one of two slots")
	}
	if r, err := allocateIDs(IDConfig{Off: true}); r != nil || err != nil {
		t.Fatalf("Off: %v, %v", r, err)
	}
}
