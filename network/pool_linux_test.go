//go:build linux

package network

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

func TestAllocateRecordsAndReuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pool := netip.MustParsePrefix("10.77.0.0/29") // two slots
	a, err := allocate(dir, "one", pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "one.json")); err != nil {
		t.Fatalf("no record after allocate: %v", err)
	}
	again, err := allocate(dir, "one", pool)
	if err != nil || *again != *a {
		t.Fatalf("allocate again = %+v, %v; want the recorded %+v", again, err, a)
	}
	b, err := allocate(dir, "two", pool)
	if err != nil || b.Slot == a.Slot {
		t.Fatalf("second allocation %+v, %v; want another slot than %d", b, err, a.Slot)
	}
	gw, addr, err := b.addrs()
	if err != nil || gw != netip.MustParseAddr("10.77.0.5") || addr != netip.MustParseAddr("10.77.0.6") {
		t.Fatalf("slot %d addresses %v %v %v; want 10.77.0.5 and 10.77.0.6", b.Slot, gw, addr, err)
	}
	if _, err := allocate(dir, "three", pool); err == nil {
		t.Fatal("a full pool allocated a third slot")
	}
	if err := forget(dir, "one"); err != nil {
		t.Fatal(err)
	}
	c, err := allocate(dir, "three", pool)
	if err != nil || c.Slot != a.Slot {
		t.Fatalf("after forget: %+v, %v; want the freed slot %d", c, err, a.Slot)
	}
}

func TestIntervalsMerge(t *testing.T) {
	t.Parallel()
	got := intervals([]netip.Prefix{
		netip.MustParsePrefix("10.1.0.0/16"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("240.0.0.0/4"),
	})
	want := [][]byte{{10, 0, 0, 0}, {11, 0, 0, 0}, {192, 0, 2, 0}, {192, 0, 3, 0}, {240, 0, 0, 0}}
	ends := []bool{false, true, false, true, false}
	if len(got) != len(want) {
		t.Fatalf("intervals = %v, want %d elements", got, len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i].Key, want[i]) || got[i].IntervalEnd != ends[i] {
			t.Errorf("element %d = %v end %v, want %v end %v", i, got[i].Key, got[i].IntervalEnd, want[i], ends[i])
		}
	}
}
