//go:build linux

package platform

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// OpenForWriting sees a writer of the file, in this process or as a loop device bound to it,
// and sees it go.
func TestOpenForWriting(t *testing.T) {
	t.Parallel()
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	reader, err := OpenFile(img, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	want := func(what string, open bool) {
		t.Helper()
		got, err := OpenForWriting(reader)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got != open {
			t.Fatalf("%s: OpenForWriting = %v, want %v", what, got, open)
		}
	}
	want("only a reader", false)
	writer, err := OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	want("beside a writer", true)
	writer.Close()
	want("the writer closed", false)

	if os.Geteuid() != 0 {
		return // a loop device needs root
	}
	dev, err := AttachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	// AttachLoop's own descriptor of the image is closed: the device alone holds it.
	want("bound to a loop device", true)
	dev.Close() // autoclear: nothing else held the device
	// The kernel clears the device on its last close (older kernels in a work queue, soon after).
	cleared, err := Poll(10*time.Second, 10*time.Millisecond, nil, func() (bool, error) {
		open, err := OpenForWriting(reader)
		return !open, err
	})
	if err != nil || !cleared {
		t.Fatalf("the loop device cleared: OpenForWriting still true (%v)", err)
	}
}

// What it costs to ask whether an image is still held, by a lease and by the loop devices'
// backing files (the way without leases), on this host with as many loop devices as it has:
//
//	go test ./platform -run '^$' -bench DiskHeld
func BenchmarkDiskHeld(b *testing.B) {
	img := filepath.Join(b.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := OpenFile(img, os.O_RDONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.Run("lease", func(b *testing.B) {
		for b.Loop() {
			if open, err := OpenForWriting(f); err != nil || open {
				b.Fatal(open, err)
			}
		}
	})
	b.Run("loop-devices", func(b *testing.B) {
		for b.Loop() {
			if _, err := LoopBackingFiles(); err != nil {
				b.Fatal(err)
			}
		}
		devices, _ := os.ReadDir("/sys/block")
		b.ReportMetric(float64(len(devices)), "block-devices")
	})
}
