//go:build linux

package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
)

// A sandbox's end has a slow part that no one needs to wait for: the release of its root.
// When the init dies its mount namespace goes, and with the last reference to the overlay
// the kernel shuts the overlay and the disk's ext4 down in the dying process: their syncs,
// the journal's checkpoint, the superblock, each flush a round trip to the host's disk
// (about 11 ms of a stop here, docs/performance.md; seconds after a workload left much
// unwritten). The shim would wait for that, since its init's exit includes it, and a stop
// for the shim.
//
// So the shim keeps a descriptor of the overlay it made (launch.held): the init's death
// unmounts it everywhere but frees nothing. Once the shim has written the outcome report it
// hands that descriptor to bothyd, on the socket its configuration names (ServeReleases),
// and exits; bothyd closes it, which releases the overlay and the disk in bothyd's time.
// Where bothyd does not answer, the shim starts a releaser instead, its own binary as
// `bothyd __release <dir>`, which closes it and exits. A shim that can do neither closes
// the descriptor itself, as before. (The releaser came first; a Go process start per stop
// costs some 3 ms of CPU, a hand-off 80 µs.)
//
// What must not overlap a release waits for the disk's lock: the shim takes an exclusive
// flock of disk.img before it attaches the image (LockDisk), keeps it for its life and hands
// it on with the overlay, and whoever releases drops it only once the close has
// returned, when the kernel is done with the image. The next launch of the sandbox takes
// the same lock before it attaches the image again, and a capture of the stopped sandbox
// before it mounts it: two superblocks on one image at a time would corrupt it. Nothing
// needs recording: a flock belongs to its open file, so it ends with its holder whatever
// happens to it (bothyd or a releaser killed still releases, in its exit), and a crash of
// the host ends the release with everything else.

// Fds of the releaser.
const (
	fdReleaseRoot = 3
	fdReleaseLock = 4
)

// diskLockWait bounds how long a launch or a capture waits for the release of an earlier
// launch's disk: milliseconds as a rule, seconds after a workload left much unwritten.
const diskLockWait = 2 * time.Minute

// LockDisk opens the disk image img and takes its lock, exclusive for a launch that writes it
// or shared for a reader, waiting (up to two minutes) while a launch runs on it or its
// release is still in progress, and then for nothing to hold the image open for writing (see
// waitDetached); waiting, unless nil, is called once if it has to wait. The lock is held
// until the returned file is closed.
func LockDisk(img string, exclusive bool, waiting func()) (*os.File, error) {
	f, err := platform.OpenFile(img, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(diskLockWait)
	if waiting != nil {
		waiting = sync.OnceFunc(waiting)
	}
	if err := platform.LockWithin(f, exclusive, diskLockWait, waiting); err != nil {
		f.Close()
		return nil, fmt.Errorf("the disk of an earlier launch is still in use or being released: %w", err)
	}
	if err := waitDetached(f, deadline, waiting); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// waitDetached waits, until deadline, for nothing to hold the image open for writing, as
// the loop device of an earlier launch does until it is cleared; f is the image, open
// read-only. waiting is called if it must wait. The lock alone does not say the kernel is
// done with the image when its holder was killed: a process's exit drops its descriptors in
// an order of the kernel's, and its flock can go before the superblock it held. The device,
// cleared when the superblock lets go of it, is the last to go, and its hold on the image
// with it.
//
// The kernel is asked with a read lease (platform.OpenForWriting), two system calls; where
// leases are not served, by the backing files of all loop devices, a read of a file per
// device (the image's path as the device reports it).
func waitDetached(f *os.File, deadline time.Time, waiting func()) error {
	writing := func() (bool, error) {
		if open, err := platform.OpenForWriting(f); err == nil {
			return open, nil
		}
		files, err := platform.LoopBackingFiles()
		if err != nil {
			return false, nil // no loop devices to look at
		}
		for _, backing := range files {
			if backing == f.Name() {
				return true, nil
			}
		}
		return false, nil
	}
	free, err := platform.Poll(time.Until(deadline), 20*time.Millisecond, waiting, func() (bool, error) {
		open, err := writing()
		return !open, err
	})
	if err == nil && !free {
		err = fmt.Errorf("the disk of an earlier launch is still held open after %v", diskLockWait)
	}
	return err
}

// held is what a launch keeps of its sandbox until the release: the overlay's mount and the
// disk's lock, each nil if there is none.
type held struct {
	root, diskLock *os.File
}

// files lists the descriptors in the releaser's order (fds 3 and 4).
func (h *held) files() []*os.File { return []*os.File{h.root, h.diskLock} }

// empty says there is nothing to release.
func (h *held) empty() bool { return h.root == nil && h.diskLock == nil }

// close releases what h holds in this process, the overlay first, then the lock.
func (h *held) close() {
	for _, f := range h.files() {
		if f != nil {
			f.Close()
		}
	}
	*h = held{}
}

// keepOnExec keeps h's descriptors open across an exec (the shed), or no longer.
func (h *held) keepOnExec(keep bool) error {
	for _, f := range h.files() {
		if f == nil {
			continue
		}
		if err := platform.SetCloseOnExec(f, !keep); err != nil {
			return err
		}
	}
	return nil
}

// fds are h's descriptor numbers for a [waitState], 0 for none.
func (h *held) fds() (root, diskLock int) {
	if h.root != nil {
		root = int(h.root.Fd())
	}
	if h.diskLock != nil {
		diskLock = int(h.diskLock.Fd())
	}
	return root, diskLock
}

// heldFrom is what a waiter inherited, by the fds a [waitState] names, close-on-exec again.
func heldFrom(root, diskLock int) held {
	var h held
	for _, e := range []struct {
		fd  int
		dst **os.File
	}{{root, &h.root}, {diskLock, &h.diskLock}} {
		if e.fd <= 2 {
			continue
		}
		unix.CloseOnExec(e.fd)
		*e.dst = os.NewFile(uintptr(e.fd), "held")
	}
	return h
}

// release hands what h holds to the bothyd at socket (see [ServeReleases]), or, when socket
// is empty or nothing takes it there, to a releaser process for the state directory dir, or
// releases it here if none can be started.
func (h *held) release(dir, socket string) {
	if h.empty() {
		return
	}
	if socket != "" {
		err := h.handOff(socket, os.Stderr)
		if err == nil {
			h.close()
			return
		}
		logf("hand the release to bothyd: %v; a releaser takes it", err)
	}
	cmd := exec.Command("/proc/self/exe", ReleaseCommand, dir) //nolint:noctx // the releaser outlives the shim, which exits next
	cmd.Args[0] = "bothyd"
	cmd.Env = []string{}
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = h.files()
	if err := cmd.Start(); err != nil {
		logf("start the releaser: %v; the shim releases the sandbox's root itself", err)
	} else {
		_ = cmd.Process.Release()
	}
	h.close()
}

// A hand-off is one message on a connection to [ServeReleases]: one byte saying which of a
// launch's held descriptors come, and the descriptors in that order, then the shim's stderr
// (the sandbox's log) for the report.
const (
	handOffRoot     = 1 << iota // the overlay
	handOffDiskLock             // the disk's lock
)

// handOffWait bounds a hand-off's connect and send: bothyd answers at once or not at all.
const handOffWait = time.Second

// handOff gives what h holds to the bothyd at socket, with report (the shim's stderr, the
// sandbox's log) for the release's report. Once the message is sent the descriptors are
// bothyd's, in flight or received: if it dies before it takes them, they close with its
// socket, as with a releaser killed before its close.
func (h *held) handOff(socket string, report *os.File) error {
	ctx, cancel := context.WithTimeout(context.Background(), handOffWait)
	defer cancel()
	conn, err := platform.DialUnixNoFollow(ctx, socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("%s is no unix socket", socket)
	}
	var flags byte
	var fds []int
	if h.root != nil {
		flags |= handOffRoot
		fds = append(fds, int(h.root.Fd()))
	}
	if h.diskLock != nil {
		flags |= handOffDiskLock
		fds = append(fds, int(h.diskLock.Fd()))
	}
	fds = append(fds, int(report.Fd()))
	oob := unix.UnixRights(fds...)
	_ = uc.SetWriteDeadline(time.Now().Add(handOffWait))
	n, oobn, err := uc.WriteMsgUnix([]byte{flags}, oob, nil)
	if err == nil && (n != 1 || oobn != len(oob)) {
		err = errors.New("the message went in part")
	}
	return err
}

// handOffsAtOnce bounds the releases bothyd runs at a time: each blocks a thread in its
// close for as long as the kernel writes back what the sandbox left.
const handOffsAtOnce = 64

// ServeReleases takes the releases that shims hand to bothyd on l (see [Config.ReleaseSocket])
// until l is closed, and does each as a releaser would: it closes the overlay, then the
// disk's lock, and writes the report to the sandbox's log. It is what spares a stop the
// releaser's process start. A connection from another user than bothyd's, or a message
// that is not a hand-off, is refused, whatever descriptors it brought closed. failed, unless
// nil, is told of each refusal.
func ServeReleases(l *net.UnixListener, failed func(error)) {
	if failed == nil {
		failed = func(error) {}
	}
	slots := make(chan struct{}, handOffsAtOnce)
	for {
		conn, err := l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			failed(err)
			time.Sleep(10 * time.Millisecond) // descriptors may be short; try again
			continue
		}
		h, report, err := takeHandOff(conn)
		conn.Close()
		if err != nil {
			failed(err)
			continue
		}
		go func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			h.releaseAndReport(report)
			report.Close()
		}()
	}
}

// takeHandOff reads one hand-off from conn.
func takeHandOff(conn *net.UnixConn) (held, *os.File, error) {
	if _, uid, _, err := platform.PeerCred(conn); err != nil || uid != os.Geteuid() {
		return held{}, nil, fmt.Errorf("a hand-off from uid %d refused (%v)", uid, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(handOffWait))
	buf := make([]byte, 2)
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for one more than a hand-off has
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	files, perr := platform.ReceivedFiles(oob[:oobn], "released") // close-on-exec: net passes MSG_CMSG_CLOEXEC
	want := 1
	if n == 1 {
		want += bits.OnesCount8(buf[0] & (handOffRoot | handOffDiskLock))
	}
	switch {
	case err == nil && perr != nil:
		err = perr
	case err == nil && (n != 1 || buf[0]&^(handOffRoot|handOffDiskLock) != 0 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || len(files) != want):
		err = fmt.Errorf("a malformed hand-off (%d bytes, %d descriptors)", n, len(files))
	}
	if err != nil {
		for _, f := range files {
			f.Close()
		}
		return held{}, nil, err
	}
	var h held
	if buf[0]&handOffRoot != 0 {
		h.root, files = files[0], files[1:]
	}
	if buf[0]&handOffDiskLock != 0 {
		h.diskLock, files = files[0], files[1:]
	}
	return h, files[0], nil
}

// releaseAndReport releases what h holds, the overlay first (closing its last descriptor
// shuts it and the disk down, in that call), then the disk's lock, and reports it on report.
func (h *held) releaseAndReport(report io.Writer) {
	start := time.Now()
	if h.root != nil {
		h.root.Close()
		h.root = nil
	}
	took := time.Since(start)
	h.close() // the lock
	fmt.Fprintf(report, "%s bothyd releaser: released the sandbox's root in %v\n", time.Now().UTC().Format(time.RFC3339Nano), took.Round(time.Microsecond))
}

// ReleaseMain is the releaser process (see above): what it inherits at fds 3 and 4 is the
// overlay and the disk's lock.
func ReleaseMain(args []string) int {
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		fmt.Fprintf(os.Stderr, "bothyd %s: want exactly one argument, the state directory\n", ReleaseCommand)
		return 2
	}
	h := heldFrom(fdReleaseRoot, fdReleaseLock)
	h.releaseAndReport(os.Stderr)
	return 0
}
