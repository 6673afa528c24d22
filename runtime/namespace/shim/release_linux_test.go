//go:build linux

package shim

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
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

// serveReleases runs ServeReleases on a socket in a directory of the test's, which it
// returns, with the refusals it is told of, until the test ends.
func serveReleases(t testing.TB) (socket string, refused <-chan error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	socket = filepath.Join(dir, "release.sock")
	f, err := platform.ListenUnix(socket, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	l := fl.(*net.UnixListener)
	errs := make(chan error, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeReleases(l, func(err error) { errs <- err })
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return socket, errs
}

// A launch's release handed to bothyd: the shim's descriptors can close at once, the lock
// ends once the server has closed what it took, and the report reaches the sandbox's log.
func TestHandOffReleases(t *testing.T) {
	socket, refused := serveReleases(t)
	dir := t.TempDir()
	img := filepath.Join(dir, EntryDiskImage)
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	lock, err := LockDisk(img, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	report, err := os.Create(filepath.Join(dir, EntryLog))
	if err != nil {
		t.Fatal(err)
	}
	h := held{root: root, diskLock: lock}
	if err := h.handOff(socket, report); err != nil {
		t.Fatal(err)
	}
	h.close()
	report.Close()
	// The server holds the lock until it has released the root; then a launch may take it.
	next, err := LockDisk(img, true, nil)
	if err != nil {
		t.Fatalf("the lock after the hand-off: %v", err)
	}
	next.Close()
	var line string
	ok, _ := platform.Poll(10*time.Second, 10*time.Millisecond, nil, func() (bool, error) {
		b, err := os.ReadFile(filepath.Join(dir, EntryLog))
		line = string(b)
		return strings.Contains(line, " bothyd releaser: released the sandbox's root in "), err
	})
	if !ok {
		t.Fatalf("the sandbox's log has no report: %q", line)
	}
	select {
	case err := <-refused:
		t.Fatalf("a hand-off refused: %v", err)
	default:
	}
}

// A message that is no hand-off is refused and what it brought is closed: a lock it carried
// ends, as if its sender had closed it.
func TestHandOffRefusesMalformed(t *testing.T) {
	socket, refused := serveReleases(t)
	img := filepath.Join(t.TempDir(), EntryDiskImage)
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	lock, err := LockDisk(img, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := platform.DialUnixNoFollow(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	// The byte names the lock, but no report follows it.
	if _, _, err := conn.(*net.UnixConn).WriteMsgUnix([]byte{handOffDiskLock}, unix.UnixRights(int(lock.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	lock.Close()
	if err := <-refused; !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("refused with %v, want a malformed hand-off", err)
	}
	next, err := LockDisk(img, true, nil)
	if err != nil {
		t.Fatalf("the lock after a refused hand-off: %v", err)
	}
	next.Close()
}

// What a hand-off costs, both sides in this process (the shim's connect and send, the
// server's accept, receive and close of nothing slow), as CPU time per hand-off, against
// the releaser process it spares a stop:
//
//	go test ./runtime/namespace/shim -run '^$' -bench HandOff
func BenchmarkHandOff(b *testing.B) {
	socket, refused := serveReleases(b)
	dir := b.TempDir()
	report, err := os.Create(filepath.Join(dir, EntryLog))
	if err != nil {
		b.Fatal(err)
	}
	defer report.Close()
	cpu := func() time.Duration {
		var ru unix.Rusage
		_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	for b.Loop() {
		root, err := os.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		h := held{root: root}
		if err := h.handOff(socket, report); err != nil {
			b.Fatal(err)
		}
		h.close()
	}
	b.ReportMetric(float64((cpu()-before).Microseconds())/float64(b.N), "cpu-µs/op")
	select {
	case err := <-refused:
		b.Fatalf("a hand-off refused: %v", err)
	default:
	}
}
