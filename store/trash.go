package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"

	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
)

// TrashDir is the directory under the state root where a removal moves a sandbox's entries
// (its disk image, its layers, its records and logs), one bin per removal, so that the
// removal answers without waiting for the file system to free them; [Store.EmptyTrash]
// deletes them afterwards. Everything in it is garbage: nothing reads it, and it may be
// emptied at any time.
const TrashDir = "trash"

// trash is the store's trash: a handle on root/trash, and the signal that it has something.
type trash struct {
	dir *os.File // nil when the trash could not be made: removals then delete in place
	// filled has a value when a removal moved entries into the trash since the last
	// [Store.Trashed] receive.
	filled chan struct{}
	// emptying serializes EmptyTrash within the process: two walks of one tree would trip
	// over each other's removals.
	emptying sync.Mutex
	// filling holds the bins that a removal of this process is moving entries into, which
	// EmptyTrash leaves alone until the moves are done.
	mu      sync.Mutex
	filling map[string]bool
}

// openTrash opens (making it if missing) the trash below rootDir. Making it needs space; a
// store on a full disk opens without one, and its removals delete in place, as they need no
// space.
func openTrash(fsys platform.FS, rootDir *os.File) *trash {
	t := &trash{filled: make(chan struct{}, 1), filling: map[string]bool{}}
	dir, err := platform.OpenDirAt(rootDir, TrashDir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := fsys.MkdirAt(rootDir, TrashDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return t
		}
		dir, err = platform.OpenDirAt(rootDir, TrashDir)
	}
	if err == nil {
		t.dir = dir
	}
	return t
}

func (t *trash) close() error {
	if t.dir == nil {
		return nil
	}
	return t.dir.Close()
}

// Trashed receives a value after a removal moved entries into the trash: the signal for a
// janitor to call [Store.EmptyTrash].
func (s *Store) Trashed() <-chan struct{} { return s.trash.filled }

// moveToTrash moves the entries names of the state directory into a new bin of the trash,
// named <id>.<random>, and returns those it did not move, for the caller to remove in place:
// all of them when the store has no trash or the bin cannot be made (a full disk: a
// directory needs a block, where removing in place needs none), and any whose move failed (an
// entry on another file system: a mount point, refused before this).
//
// Moving needs no lock beyond the sandbox's: the bin's name is new, and nothing but
// EmptyTrash touches the trash, which leaves a bin this process is filling alone. Another
// process's EmptyTrash (bothyd check --repair beside a server) may remove the bin under the
// moves: a move that then fails is one the caller removes in place. The moves are made
// durable by the caller's sync of the state directory; one lost in a crash of the host leaves
// the entry where it was, for the removal that the still present configuration record calls
// for to take again.
func (l *Lock) moveToTrash(names []string) (left []string) {
	return l.moveToTrashFrom(l.dir, names)
}

// Discard moves the entries names of dir, a directory below the locked sandbox's state
// directory that the caller opened, into a new bin of the trash, as a removal moves the
// state directory's own entries (see moveToTrash), and returns those it did not move, for
// the caller to remove in place. The janitor deletes the bin without the sandbox's lock:
// for what a transition throws away and need not wait for (package checkpoint's discarded
// layers), a rename under the lock instead of a removal.
func (l *Lock) Discard(dir *os.File, names []string) (left []string) {
	return l.moveToTrashFrom(dir, names)
}

func (l *Lock) moveToTrashFrom(from *os.File, names []string) (left []string) {
	t := l.s.trash
	if t.dir == nil || len(names) == 0 {
		return names
	}
	bin := l.id + "." + naming.RandomHex(8)
	t.fill(bin, true)
	made := false
	defer func() {
		// Unmarked before the signal: the janitor it wakes must not skip the bin as still
		// being filled, and then sleep until the next removal.
		t.fill(bin, false)
		if made {
			t.signal()
		}
	}()
	if err := l.s.fs.MkdirAt(t.dir, bin, 0o700); err != nil {
		return names
	}
	made = true
	d, err := platform.OpenDirAt(t.dir, bin)
	if err != nil {
		return names
	}
	defer d.Close()
	for _, name := range names {
		err := l.s.fs.MoveNoReplaceAt(from, name, d, name)
		if errors.Is(err, fs.ErrNotExist) {
			// The entry is gone, or the bin is (another process emptied the trash): only
			// the first is done.
			if _, serr := platform.LstatAt(from, name); errors.Is(serr, fs.ErrNotExist) {
				err = nil
			}
		}
		if err != nil {
			left = append(left, name)
		}
	}
	return left
}

// fill marks bin as being filled by this process, or no longer.
func (t *trash) fill(bin string, on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if on {
		t.filling[bin] = true
	} else {
		delete(t.filling, bin)
	}
}

func (t *trash) isFilling(bin string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.filling[bin]
}

func (t *trash) signal() {
	select {
	case t.filled <- struct{}{}:
	default:
	}
}

// TrashBins lists the bins in the trash: what removals moved there that is not deleted yet.
func (s *Store) TrashBins() ([]string, error) {
	if s.trash.dir == nil {
		return nil, nil
	}
	names, err := platform.ReadDirNames(s.trash.dir)
	if err != nil {
		return nil, s.storage(err)
	}
	slices.Sort(names)
	return names, nil
}

// EmptyTrash deletes every bin in the trash, as a removal deletes a state directory's
// entries (links removed, never followed; bounded descriptors however deep the tree), and
// returns how many it deleted. Whatever is in the trash may go: a crash in the middle leaves
// the rest for the next call.
func (s *Store) EmptyTrash() (int, error) {
	if s.trash.dir == nil {
		return 0, nil
	}
	s.trash.emptying.Lock()
	defer s.trash.emptying.Unlock()
	bins, err := s.TrashBins()
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, bin := range bins {
		if s.trash.isFilling(bin) {
			continue // a removal is moving entries into it; its signal comes once it is done
		}
		if err := s.fs.RemoveAllAt(s.trash.dir, bin); err != nil && !errors.Is(err, fs.ErrNotExist) {
			if _, serr := platform.LstatAt(s.trash.dir, bin); errors.Is(serr, fs.ErrNotExist) {
				continue // another process emptied it meanwhile (a second server, bothyd check)
			}
			errs = append(errs, fmt.Errorf("store: empty the trash: %w", err))
			continue
		}
		n++
	}
	return n, s.storage(errors.Join(errs...))
}
