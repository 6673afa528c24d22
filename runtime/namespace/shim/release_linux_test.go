//go:build linux

package shim

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/platform"
)

// TestLockDiskWaitsForTheLoopDevice: a launch that has the disk's lock still waits while a
// loop device holds the image, as one of a killed holder does for a moment after its flock has
// gone, and goes on once the device is cleared.
func TestLockDiskWaitsForTheLoopDevice(t *testing.T) {
	needRoot(t) // a loop device
	img := filepath.Join(t.TempDir(), EntryDiskImage)
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := platform.AttachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() {
		<-waited
		dev.Close() // autoclear: the device goes with its last holder
	}()
	lock, err := LockDisk(img, true, func() { close(waited) })
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	defer lock.Close()
	select {
	case <-waited:
	default:
		dev.Close()
		t.Fatal("LockDisk took the disk while a loop device held it")
	}
	if open, err := platform.OpenForWriting(lock); err != nil || open {
		t.Fatalf("after LockDisk the image is still open for writing: %v, %v", open, err)
	}
}
