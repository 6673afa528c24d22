package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// ErrNotPrivate is wrapped by the error of a provision that finds an existing state directory
// that is not private to the service's user (owned by it, no access for group or others).
var ErrNotPrivate = errors.New("state directory is not private to the service's user")

// Lock is a held lifecycle lock on one sandbox's state directory. It is not safe for use by
// several goroutines at once, except that Unlock may be called more than once.
type Lock struct {
	s    *Store
	id   string
	path string
	dir  *os.File // the state directory, as opened and checked when the lock was taken
	f    *os.File // sandbox.lock, flocked

	mu       sync.Mutex
	released bool
	ended    bool // the lock stopped excluding others: its file was unlinked or unlocked
}

// ID returns the sandbox id.
func (l *Lock) ID() string { return l.id }

// Dir returns the absolute path of the state directory.
func (l *Lock) Dir() string { return l.path }

// LockForProvision takes the lifecycle lock of id for a provision: it creates the state
// directory (mode 0700) if it is missing, and again if a concurrent removal deletes it while
// the lock is being taken. It refuses an existing directory that is not private to the
// service's user. Whether the sandbox is already provisioned is the caller's check, under the
// lock (see Lock.RequireUnprovisioned).
//
// The wait is bounded by ctx's deadline, which ctx must have; see LockExisting.
func (s *Store) LockForProvision(ctx context.Context, id string) (*Lock, error) {
	return s.lock(ctx, id, true)
}

// LockExisting takes the lifecycle lock of the provisioned sandbox id. It fails with
// sandbox-not-found when the state directory is gone or holds no configuration record, also
// when that is found only after waiting through a concurrent removal.
//
// While another transition holds the lock, it tries again every 25 ms until ctx's deadline,
// starts no attempt after it, and then fails with transition-in-progress. A ctx without a
// deadline is refused (invalid-request, field "timeout") before anything waits: every wait
// must be bounded. A deadline that has already passed still gets one attempt, which makes a
// tiny timeout a "try once". A cancelled ctx ends the wait with ctx's error.
func (s *Store) LockExisting(ctx context.Context, id string) (*Lock, error) {
	return s.lock(ctx, id, false)
}

func (s *Store) lock(ctx context.Context, id string, provision bool) (_ *Lock, err error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	var l *Lock
	defer func() { err = s.storage(err) }()
	err = Retry(ctx, func() error { return transitionInProgress(id) }, func() (Attempt, error) {
		s.hook(hookAttempt)
		got, res, err := s.try(id, provision)
		switch {
		case err != nil:
			return Failed, err
		case res == Acquired:
			l = got
		case res == Busy:
			s.hook(hookBusy)
		}
		return res, nil
	})
	return l, err
}

// Attempt is what one try at a lock reports to [Retry].
type Attempt int

const (
	// Failed: give up. An attempt that returns an error reports Failed with it, and Retry
	// returns that error; the zero Attempt is Failed, so that an attempt that forgets to say
	// otherwise never passes for Acquired.
	Failed Attempt = iota
	// Acquired: the lock is held (and whatever the attempt checks under it holds); Retry
	// returns nil.
	Acquired
	// Busy: another holder has the lock; Retry tries again after RetryInterval, unless the
	// deadline passed.
	Busy
	// Raced: a concurrent change (a removal of the state directory or of the lock file) made
	// the attempt moot; Retry tries again at once.
	Raced
)

func (a Attempt) String() string {
	switch a {
	case Failed:
		return "failed"
	case Acquired:
		return "acquired"
	case Busy:
		return "busy"
	case Raced:
		return "raced"
	}
	return fmt.Sprintf("Attempt(%d)", int(a))
}

// Retry is the waiting rule of every lock of bothyd (the lifecycle lock, the template
// store's lock, exec admission): try at once, then every RetryInterval while attempt reports
// [Busy], until it reports [Acquired] or fails (an error, or [Failed]), or ctx's deadline
// passes; no attempt starts after the deadline, and an attempt that reports [Raced] is made
// again at once. ctx must have a deadline: without one Retry refuses with invalid-request
// before anything waits. When the deadline passes it returns busy(); a cancelled ctx returns
// ctx.Err(). An attempt's error is returned as it is, whatever the attempt reports with it; a
// Failed without an error is a bug of the attempt, returned as an internal error.
func Retry(ctx context.Context, busy func() error, attempt func() (Attempt, error)) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		return errcode.Invalid("timeout", "The operation needs a finite, positive timeout.")
	}
	if err := ctx.Err(); errors.Is(err, context.Canceled) {
		return err
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for n := 0; ; n++ {
		if n > 0 {
			// No attempt starts once the deadline has passed.
			if err := ctx.Err(); errors.Is(err, context.Canceled) {
				return err
			}
			if ctx.Err() != nil || !time.Now().Before(deadline) {
				return busy()
			}
		}
		res, err := attempt()
		switch {
		case err != nil:
			return err
		case res == Acquired:
			return nil
		case res == Raced:
			continue
		case res != Busy:
			return errcode.Wrap(errcode.Internal, fmt.Errorf("store: a lock attempt reported %v without an error", res),
				"A lock attempt failed without saying why; report this as a bug.")
		}
		wait := min(RetryInterval, time.Until(deadline))
		if wait <= 0 {
			return busy()
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return ctx.Err()
			}
			return busy()
		}
	}
}

func transitionInProgress(id string) error {
	return errcode.New(errcode.TransitionInProgress,
		"Another operation on sandbox %s is still in progress; try again when it has finished, or give a longer timeout.", id)
}

func notFound(id string, err error) error {
	return errcode.Wrap(errcode.SandboxNotFound, err, "There is no sandbox %s; create it first, or check the id.", id)
}

// try makes one attempt at the lock, never blocking, in three phases: open the state
// directory, flock its lock file, and check under the lock what the lock promises.
func (s *Store) try(id string, provision bool) (*Lock, Attempt, error) {
	dir, res, err := s.openStateDir(id, provision)
	if dir == nil {
		return nil, res, err
	}
	f, res, err := s.flockLockFile(id, dir)
	if f == nil {
		if provision && res == Failed {
			// The lock file could not be made (a full or failing disk): a directory this
			// provision may have just made must not stay behind as a sandbox that is not
			// one. Removing it if empty is harmless to everyone, as in Unlock.
			err = errors.Join(err, s.removeDirIfEmpty(id, dir))
		}
		dir.Close()
		return nil, res, err
	}
	l := &Lock{s: s, id: id, path: filepath.Join(s.root, SandboxesDir, id), dir: dir, f: f}
	s.hook(hookLocked)
	if err := l.removeLockedTemps(); err != nil {
		return nil, Failed, errors.Join(err, l.Unlock())
	}
	if !provision {
		has, err := l.hasConfig()
		if err == nil && !has {
			err = notFound(id, fs.ErrNotExist)
		}
		if err != nil {
			// Unlock removes the lock file we may have just created, and the directory if
			// that leaves it empty.
			if uerr := l.Unlock(); uerr != nil {
				err = errors.Join(err, uerr)
			}
			return nil, Failed, err
		}
	}
	return l, Acquired, nil
}

// openStateDir opens the state directory of id, for a provision after creating it if it is
// missing, and refuses one that is not private to the service's user. A nil directory comes
// with what the attempt amounts to: Raced or Failed.
func (s *Store) openStateDir(id string, provision bool) (*os.File, Attempt, error) {
	if provision {
		if err := s.fs.MkdirAt(s.sbx, id, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, Failed, fmt.Errorf("store: create state directory of %s: %w", id, err)
		}
	}
	s.hook(hookMkdir)
	dir, err := platform.OpenDirAt(s.sbx, id)
	if errors.Is(err, fs.ErrNotExist) {
		if provision {
			// A removal deleted the directory between mkdir and open: create it again.
			return nil, Raced, nil
		}
		return nil, Failed, notFound(id, err)
	}
	if err != nil {
		return nil, Failed, errcode.Wrap(errcode.Internal, err,
			"The state directory of sandbox %s is not a directory; remove it by hand.", id)
	}
	s.hook(hookDirOpened)
	if provision {
		if err := requirePrivate(id, dir); err != nil {
			dir.Close()
			return nil, Failed, err
		}
	}
	return dir, Acquired, nil
}

// requirePrivate refuses a state directory that is not owned by the service's user or that
// its group or others can access.
func requirePrivate(id string, dir *os.File) error {
	st, err := platform.StatOf(dir)
	if err != nil {
		return err
	}
	if st.UID != uint32(os.Geteuid()) || st.Mode.Perm()&0o077 != 0 {
		return errcode.Wrap(errcode.Internal,
			fmt.Errorf("%w: owner %d, mode %v", ErrNotPrivate, st.UID, st.Mode.Perm()),
			"The state directory of sandbox %s is not private to bothyd's user; fix its owner and mode (0700) or remove it.", id)
	}
	return nil
}

// flockLockFile opens the lock file in dir, the state directory of id (creating the file if
// it is missing), takes its flock without waiting, and checks that the file and dir are still
// the lock of id. It returns the flocked file, or nil with what the attempt amounts to: Busy,
// Raced or Failed.
func (s *Store) flockLockFile(id string, dir *os.File) (*os.File, Attempt, error) {
	// O_RDONLY is enough for flock; with O_CREATE the lock file comes back after a holder
	// that found no configuration record removed it.
	f, err := s.fs.OpenFileAt(dir, LockName, os.O_RDONLY|os.O_CREATE, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		// The directory was removed after we opened it: start over from the name.
		return nil, Raced, nil
	}
	if errors.Is(err, platform.ErrNotRegular) {
		return nil, Failed, errcode.Wrap(errcode.Internal, err,
			"The lock file of sandbox %s is not a regular file; remove it by hand.", id)
	}
	if err != nil {
		// Not the lock file's fault: the disk's (full, read-only), which the caller's
		// boundary names.
		return nil, Failed, fmt.Errorf("store: open the lock file of %s: %w", id, err)
	}
	s.hook(hookOpened)
	got, err := platform.TryLock(f)
	if got {
		s.hook(hookFlocked)
	}
	var res Attempt
	switch {
	case err != nil:
		res = Failed
	case !got:
		res = Busy
	default:
		res, err = s.stillTheLock(id, dir, f)
	}
	if res != Acquired {
		// Closing drops the flock, if we took it.
		f.Close()
		return nil, res, err
	}
	return f, Acquired, nil
}

// stillTheLock reports whether the flocked f is still the lock of id: the lock counts only if
// the directory entry still names that file and the state directory's name still names the
// directory dir we opened. A removal unlinks the lock file (and the directory) while holding
// the lock, so a waiter that opened the old file gets it only after it stopped being the
// lock; that waiter's attempt Raced.
func (s *Store) stillTheLock(id string, dir, f *os.File) (Attempt, error) {
	if same, err := sameEntry(dir, LockName, f); err != nil {
		return Failed, err
	} else if !same {
		return Raced, nil
	}
	if same, err := sameEntry(s.sbx, id, dir); err != nil {
		return Failed, err
	} else if !same {
		return Raced, nil
	}
	return Acquired, nil
}

// lockedRecords are the records written only under the lock (not outcome.json, which the
// runtime process writes without it).
var lockedRecords = []string{ConfigName, LaunchName, RuntimeName}

// removeLockedTemps removes the temp leftovers of writes of records that only a lock holder
// writes: now that we hold the lock, no such write can be in flight, so any is a leftover of a
// holder that crashed mid-write.
func (l *Lock) removeLockedTemps() error {
	return l.removeTemps(func(target string) bool { return slices.Contains(lockedRecords, target) })
}

// removeTemps removes the store's temp files (the fixed temp-name form, and nothing else)
// of the records that of says, and syncs the directory if it removed any.
func (l *Lock) removeTemps(of func(target string) bool) error {
	names, err := platform.ReadDirNames(l.dir)
	if err != nil {
		return err
	}
	removed := false
	for _, name := range names {
		if target, ok := platform.IsTempName(name); ok && of(target) {
			if err := l.s.fs.UnlinkAt(l.dir, name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			removed = true
		}
	}
	if removed {
		return l.s.fs.SyncDir(l.dir)
	}
	return nil
}

// sameEntry reports whether the entry name in dir is the open file f.
func sameEntry(dir *os.File, name string, f *os.File) (bool, error) {
	st, err := platform.LstatAt(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	id, err := platform.IDOf(f)
	if err != nil {
		return false, err
	}
	return st.ID == id, nil
}

// hasConfig reports whether the configuration record exists (of any type: a non-regular one
// is reported when it is read).
func (l *Lock) hasConfig() (bool, error) {
	_, err := platform.LstatAt(l.dir, ConfigName)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Provisioned reports whether the sandbox has a configuration record.
func (l *Lock) Provisioned() (bool, error) {
	has, err := l.hasConfig()
	return has, l.s.storage(err)
}

// RequireUnprovisioned returns an already-provisioned error if the sandbox has a
// configuration record: the check a provision makes under the lock.
func (l *Lock) RequireUnprovisioned() error {
	has, err := l.hasConfig()
	if err != nil {
		return l.s.storage(err)
	}
	if has {
		return errcode.New(errcode.AlreadyProvisioned, "A sandbox with id %s already exists; choose another id or delete it first.", l.id)
	}
	return nil
}

// Unlock releases the lock. If the directory has no configuration record (a provision that
// failed, a removal that left foreign files, a not-found), it first removes its lock file —
// only while the entry is still the file it locked — and then the directory if that left it
// empty, so that no stale directory keeps a lock file. Calling Unlock again does nothing.
func (l *Lock) Unlock() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	l.released = true
	var errs []error
	has, err := l.hasConfig()
	if err != nil {
		errs = append(errs, err)
	} else if !has {
		errs = append(errs, l.removeLockFile())
		errs = append(errs, l.s.removeDirIfEmpty(l.id, l.dir))
	}
	errs = append(errs, l.release())
	return l.s.storage(errors.Join(errs...))
}

// removeLockFile unlinks sandbox.lock if the entry is still the file this lock holds. Only a
// holder ever removes a lock file, so between the check and the unlink nobody can replace it.
func (l *Lock) removeLockFile() error {
	same, err := sameEntry(l.dir, LockName, l.f)
	if err != nil || !same {
		return err
	}
	// Once the entry is gone a new lock file can be made and locked: this lock's exclusion ends.
	l.end()
	if err := l.s.fs.UnlinkAt(l.dir, LockName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// end marks the moment the lock stops excluding others (for tests that check exclusion).
func (l *Lock) end() {
	if !l.ended {
		l.ended = true
		l.s.hook(hookEnded)
	}
}

// removeDirIfEmpty removes the state directory of id if its name still names dir and it is
// empty. Removing an empty directory is harmless to everyone else: whoever opened it to lock
// finds it gone and starts over.
func (s *Store) removeDirIfEmpty(id string, dir *os.File) error {
	same, err := sameEntry(s.sbx, id, dir)
	if err != nil || !same {
		return err
	}
	err = s.fs.RmdirAt(s.sbx, id)
	switch {
	case err == nil:
		return s.fs.SyncDir(s.sbx)
	case errors.Is(err, fs.ErrNotExist), isNotEmpty(err):
		return nil
	}
	return err
}

// release drops the flock and closes the handles.
func (l *Lock) release() error {
	l.end()
	uerr := platform.Unlock(l.f)
	cerr := l.f.Close()
	l.dir.Close()
	return errors.Join(uerr, cerr)
}
