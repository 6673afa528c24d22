package agent

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
)

var _ control.DirWatcher = (*agent)(nil)

// watchMask is what a watched directory reports: entries created, written, removed, renamed
// in or out and changed in their attributes, and the directory's own end. IN_EXCL_UNLINK
// keeps a removed file that stays open from reporting anything more.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watchBatch is how many events one data frame carries at most: with paths of up to
// control.MaxPathLen bytes they stay well below a frame's payload.
const watchBatch = 128

// Watch implements control.DirWatcher with inotify: one inotify instance per watch, one
// watch descriptor per directory (below the root too, with Recursive, those created later
// included), at most control.MaxWatchDirs of them. A reader turns the kernel's events into
// control.WatchEvent and queues them, at most control.MaxWatchQueued; the caller's goroutine
// sends them in batches. A client that falls behind loses events past the queue's bound and
// gets one overflow event for them, so a watch never holds more than its bounds however busy
// the directory (the kernel's own queue is bounded the same way: its overflow is reported
// alike).
//
// Every watch is added with the request user's file-system identity, so the user watches
// only directories it may read.
func (a *agent) Watch(ctx context.Context, req *control.WatchRequest, started func() error, emit func([]control.WatchEvent) error) error {
	root := filepath.Clean(req.Path)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	// Non-blocking, the descriptor is served by Go's poller: Close ends a blocked Read.
	f := os.NewFile(uintptr(fd), "inotify")
	w := &dirWatch{a: a, fd: fd, root: root, user: req.User, recursive: req.Recursive,
		dirs: map[int]string{}, wake: make(chan struct{}, 1)}
	if err := a.asUser(req.User, func() error {
		var st unix.Stat_t
		if err := unix.Stat(root, &st); err != nil {
			return fileError(err, root)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return &control.RemoteError{Code: control.CodeNotADirectory, Message: fmt.Sprintf("%q is not a directory.", truncate(root))}
		}
		if req.RefuseNetwork {
			network, err := onNetworkFS(root)
			if err != nil {
				return fileError(err, root)
			}
			if network {
				return &control.RemoteError{Code: control.CodeInvalidRequest, Message: fmt.Sprintf(
					"%q is on a network or FUSE file system, whose changes inotify may not see, and the watch refuses such a directory.", truncate(root))}
			}
		}
		return w.addTree("", true)
	}); err != nil {
		f.Close()
		return err
	}
	if err := started(); err != nil {
		f.Close()
		return err
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		w.read(f)
	}()
	defer func() {
		f.Close()
		<-readerDone
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		}
		batch, end := w.take()
		// In pieces that fit a frame whatever the names' lengths.
		for len(batch) > 0 {
			n := min(len(batch), watchBatch)
			if err := emit(batch[:n]); err != nil {
				return nil // the client is gone
			}
			batch = batch[n:]
		}
		if end {
			return nil
		}
	}
}

// dirWatch is one watch's state, shared by its reader and its sender.
type dirWatch struct {
	a         *agent
	fd        int
	root      string
	user      string
	recursive bool

	mu       sync.Mutex
	dirs     map[int]string // watch descriptor -> directory relative to root ("" is root)
	dirsFull bool           // a directory was left unwatched: reported once
	queue    []control.WatchEvent
	lost     bool // events were dropped since the last batch
	ended    bool // the root went away, or the reader failed
	wake     chan struct{}
}

// addTree watches the directory rel (relative to the root) and, with recursive, every
// directory below it. It runs with the user's identity (asUser); a directory that vanished
// or that the user may not read is skipped, but at the root that is the caller's error.
func (w *dirWatch) addTree(rel string, isRoot bool) error {
	w.mu.Lock()
	full := len(w.dirs) >= control.MaxWatchDirs
	if full && !w.dirsFull {
		w.dirsFull = true
		w.queueLocked(control.WatchEvent{Name: rel, Op: control.WatchOverflow})
	}
	w.mu.Unlock()
	if full {
		return nil
	}
	abs := filepath.Join(w.root, rel)
	mask := uint32(watchMask)
	if !isRoot {
		mask |= unix.IN_DONT_FOLLOW
	}
	wd, err := unix.InotifyAddWatch(w.fd, abs, mask)
	if err != nil {
		if isRoot {
			return fileError(err, abs)
		}
		return nil
	}
	w.mu.Lock()
	w.dirs[wd] = rel
	w.mu.Unlock()
	if !w.recursive {
		return nil
	}
	entries, err := os.ReadDir(abs)
	if err != nil {
		return nil
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := w.addTree(path.Join(rel, e.Name()), false); err != nil {
				return err
			}
		}
	}
	return nil
}

// read turns the kernel's events into the queue until the descriptor is closed or the root
// goes away.
func (w *dirWatch) read(f *os.File) {
	defer func() {
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
		w.notify()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameLen := int(ev.Len)
			end := off + unix.SizeofInotifyEvent + nameLen
			if end > n {
				break
			}
			name := string(trimNUL(buf[off+unix.SizeofInotifyEvent : end]))
			off = end
			if w.handle(int(ev.Wd), ev.Mask, name) {
				return
			}
		}
		w.notify()
	}
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// handle queues what one kernel event means, and reports whether the watch is over.
func (w *dirWatch) handle(wd int, mask uint32, name string) bool {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.mu.Lock()
		w.lost = true
		w.mu.Unlock()
		return false
	}
	w.mu.Lock()
	dir, ok := w.dirs[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
	}
	w.mu.Unlock()
	if !ok {
		return false
	}
	if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
		// The directory's own end: its parent reports it (remove or rename) where it is
		// watched; the root's ends the watch.
		return dir == ""
	}
	if mask&unix.IN_IGNORED != 0 {
		return false
	}
	rel := path.Join(dir, name)
	var op control.WatchOp
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		op = control.WatchCreate
	case mask&unix.IN_MODIFY != 0:
		op = control.WatchWrite
	case mask&unix.IN_DELETE != 0:
		op = control.WatchRemove
	case mask&unix.IN_MOVED_FROM != 0:
		op = control.WatchRename
	case mask&unix.IN_ATTRIB != 0:
		op = control.WatchChmod
	default:
		return false
	}
	if op == control.WatchCreate && mask&unix.IN_ISDIR != 0 && w.recursive {
		// A new directory (made, or moved in) is watched as well, with what it already
		// holds, before its creation is reported: a client that reacts to the event by
		// writing into it sees that write. An error here is the user's permission or a
		// vanished directory: skipped.
		_ = w.a.asUser(w.user, func() error { return w.addTree(rel, false) })
	}
	w.mu.Lock()
	w.queueLocked(control.WatchEvent{Name: rel, Op: op})
	w.mu.Unlock()
	return false
}

// queueLocked queues ev, or drops it (and remembers the loss) when the queue is full.
func (w *dirWatch) queueLocked(ev control.WatchEvent) {
	if len(w.queue) >= control.MaxWatchQueued {
		w.lost = true
		return
	}
	w.queue = append(w.queue, ev)
}

func (w *dirWatch) notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take hands the queued events to the sender, with an overflow event for any that were lost,
// and says whether the watch ended.
func (w *dirWatch) take() ([]control.WatchEvent, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	batch := w.queue
	w.queue = nil
	if w.lost {
		w.lost = false
		batch = append(batch, control.WatchEvent{Op: control.WatchOverflow})
	}
	return batch, w.ended
}
