package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/store"
)

// DefaultMaxAge is how long after its capture a generation stays eligible unless
// Options.MaxAge says otherwise.
const DefaultMaxAge = 30 * 24 * time.Hour

// Options configure a Store. The zero value is the production configuration.
type Options struct {
	// MaxAge is the longest downtime since capture at which a generation is eligible
	// (DefaultMaxAge when zero).
	MaxAge time.Duration
	// Now reads the host's time for eligibility and for the time contract of captures; the
	// default reads the machine id, the boot id, CLOCK_BOOTTIME and the UTC clock. Tests
	// inject a clock here.
	Now func() (TimeContract, error)
	// OnSync, if set, is called after every durable step (a record written and its directory
	// fsynced, an entry removed and its directory fsynced, a rename made durable) with the
	// step's name (the Step* constants). The order of these calls is part of the contract;
	// tests record it, and crash tests kill the process in it.
	OnSync func(step string)
	// FS makes the store's changes on disk; the zero value makes them directly. Tests set its
	// Fault to fail chosen steps as a full or failing disk would. (The copier of a capture
	// writes the payload with its own system calls; its faults are tested on a real full
	// file system.)
	FS platform.FS
}

// The durable steps reported to Options.OnSync, in the order each operation makes them.
const (
	StepTemplateCreate  = "template:create"  // template.json written
	StepTemplateUpdate  = "template:update"  // template.json rewritten (deleting mark)
	StepTemplateRemove  = "template:remove"  // template.json removed
	StepTemplateDir     = "template:dir"     // the template's directory removed
	StepCaptureReserve  = "capture:reserve"  // next_generation bumped, staging directory made
	StepCaptureCopied   = "capture:copied"   // the payload is copied and fsynced in staging
	StepCaptureIndex    = "capture:index"    // index.json written in staging
	StepCaptureCommit   = "capture:commit"   // staging renamed to the generation, parent fsynced
	StepLeaseWrite      = "lease:write"      // a lease record written
	StepLeaseRemove     = "lease:remove"     // a lease record removed (release)
	StepLeaseSweep      = "lease:sweep"      // a lease record whose binding is gone removed
	StepTombstone       = "tombstone:write"  // tombstone.json written
	StepRetirePayload   = "retire:payload"   // the payload removed
	StepRetireIndex     = "retire:index"     // index.json removed
	StepRetireTombstone = "retire:tombstone" // tombstone.json removed
	StepRetireDir       = "retire:dir"       // the generation's directory removed
	StepCleanStaging    = "clean:staging"    // leftovers of a dead capture or write removed
)

// Store is the template store under <state root>/templates. Its methods are safe for
// concurrent use, and any number of processes may open stores on one root: every change is
// made under the store's lock file, which is an flock shared by all of them.
type Store struct {
	root string   // absolute path of the state root, named by storage faults
	path string   // absolute path of the templates directory
	dir  *os.File // the templates directory, opened once without following links
	opts Options
}

// Open opens the template store under the state root stateRoot, creating the root and its
// templates directory (mode 0700) if they are missing. A templates directory that is a link or
// not a directory is refused.
func Open(stateRoot string, opts Options) (_ *Store, err error) {
	defer func() { err = errcode.Storage(err, stateRoot) }()
	if opts.MaxAge == 0 {
		opts.MaxAge = DefaultMaxAge
	}
	if opts.MaxAge < 0 {
		return nil, errcode.Invalid("max_age", "The maximum age of a generation must be positive.")
	}
	if opts.Now == nil {
		opts.Now = HostNow
	}
	abs, err := filepath.Abs(stateRoot)
	if err != nil {
		return nil, fmt.Errorf("template: state root %q: %w", stateRoot, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("template: create state root: %w", err)
	}
	root, err := platform.OpenDir(abs)
	if err != nil {
		return nil, fmt.Errorf("template: state root %s must be a directory, not a link: %w", abs, err)
	}
	defer root.Close()
	if err := opts.FS.MkdirAt(root, TemplatesDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("template: create %s: %w", TemplatesDir, err)
	}
	dir, err := platform.OpenDirAt(root, TemplatesDir)
	if err != nil {
		return nil, fmt.Errorf("template: %s must be a directory, not a link: %w", TemplatesDir, err)
	}
	st, err := platform.StatOf(dir)
	if err != nil {
		dir.Close()
		return nil, err
	}
	if st.UID != uint32(os.Geteuid()) || st.Mode.Perm()&0o077 != 0 {
		dir.Close()
		return nil, fmt.Errorf("template: %s is not private to bothyd's user (owner %d, mode %v); fix its owner and mode (0700)", filepath.Join(abs, TemplatesDir), st.UID, st.Mode.Perm())
	}
	return &Store{root: abs, path: filepath.Join(abs, TemplatesDir), dir: dir, opts: opts}, nil
}

// storage gives err the code of its storage fault, if it has one (see [errcode.Storage]):
// every error the store returns passes through it.
func (s *Store) storage(err error) error { return errcode.Storage(err, s.root) }

// Close releases the store's directory handle.
func (s *Store) Close() error { return s.dir.Close() }

// Path returns the absolute path of the templates directory.
func (s *Store) Path() string { return s.path }

// MaxAge returns the longest downtime at which a generation is eligible.
func (s *Store) MaxAge() time.Duration { return s.opts.MaxAge }

// Now reads the host's time through the configured clock, for Select, Leasable and views.
func (s *Store) Now() (TimeContract, error) { return s.opts.Now() }

// HostNow reads this host's time: machine id, boot id, CLOCK_BOOTTIME and UTC. A host without
// a machine id (a slim container) reads an empty host id rather than failing: the boot id
// still names the boot.
func HostNow() (TimeContract, error) {
	host, err := platform.MachineID()
	if err != nil {
		host = ""
	}
	boot, err := platform.BootID()
	if err != nil {
		return TimeContract{}, err
	}
	mono, err := platform.Boottime()
	if err != nil {
		return TimeContract{}, err
	}
	return TimeContract{HostID: host, BootID: boot, Clock: ClockBoottime, Monotonic: mono, UTC: time.Now().UTC()}, nil
}

func (s *Store) synced(step string) {
	if s.opts.OnSync != nil {
		s.opts.OnSync(step)
	}
}

// Tx is a held template store lock. Every change to the store happens under one; a caller
// that must interleave its own steps (cloning writes the sandbox's clone.json between the
// lease and the unlock) takes one with Store.Lock. A Tx is for one goroutine; Unlock may be
// called more than once.
type Tx struct {
	s  *Store
	f  *os.File
	mu sync.Mutex
	// done is set by Unlock.
	done bool
}

// Lock takes the template store's lock: an exclusive flock on templates/templates.lock,
// tried every 25 ms until ctx's deadline (which ctx must have; a ctx without one is refused
// with invalid-request before anything waits), then transition-in-progress. A lock file that
// is a link, a FIFO or not a regular file is refused.
func (s *Store) Lock(ctx context.Context) (_ *Tx, err error) {
	var tx *Tx
	defer func() { err = s.storage(err) }()
	err = store.Retry(ctx, lockBusy, func() (store.Attempt, error) {
		t, got, err := s.tryLock()
		switch {
		case err != nil:
			return store.Failed, err
		case !got:
			return store.Busy, nil
		}
		tx = t
		return store.Acquired, nil
	})
	return tx, err
}

func lockBusy() error {
	return errcode.New(errcode.TransitionInProgress,
		"Another template operation is still in progress; try again when it has finished, or give a longer timeout.")
}

func (s *Store) tryLock() (*Tx, bool, error) {
	f, err := s.opts.FS.OpenFileAt(s.dir, LockName, os.O_RDONLY|os.O_CREATE, 0o600)
	if errors.Is(err, platform.ErrNotRegular) {
		return nil, false, errcode.Wrap(errcode.Internal, err,
			"The template store's lock file is not a regular file; remove it by hand.")
	}
	if err != nil {
		return nil, false, fmt.Errorf("template: open the lock file: %w", err)
	}
	got, err := platform.TryLock(f)
	if err != nil || !got {
		f.Close()
		return nil, false, err
	}
	// The lock file is never removed, but whoever replaces it by hand must not make two
	// holders: the lock counts only while the entry still names the file we locked.
	st, err := platform.LstatAt(s.dir, LockName)
	id, ierr := platform.IDOf(f)
	if err != nil || ierr != nil || st.ID != id {
		_ = platform.Unlock(f)
		f.Close()
		if err == nil && ierr == nil {
			return nil, false, nil
		}
		return nil, false, errors.Join(err, ierr)
	}
	return &Tx{s: s, f: f}, true, nil
}

// Unlock releases the lock. Calling it again does nothing.
func (tx *Tx) Unlock() error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return nil
	}
	tx.done = true
	uerr := platform.Unlock(tx.f)
	return errors.Join(uerr, tx.f.Close())
}

func (tx *Tx) check() error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return errors.New("template: use of a released template store lock")
	}
	return nil
}

// withLock runs fn under the store's lock.
func (s *Store) withLock(ctx context.Context, fn func(tx *Tx) error) error {
	tx, err := s.Lock(ctx)
	if err != nil {
		return err
	}
	err = fn(tx)
	return s.storage(errors.Join(err, tx.Unlock()))
}

func templateNotFound(name string) error {
	return errcode.New(errcode.TemplateNotFound, "There is no template %s.", name)
}

func generationNotFound(name, gen string) error {
	return errcode.New(errcode.GenerationNotFound, "Template %s has no generation %s.", name, gen)
}

// openTemplateDir opens the template's directory; found is false when it does not exist.
func (s *Store) openTemplateDir(name string) (*os.File, bool, error) {
	d, err := platform.OpenDirAt(s.dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, errcode.Wrap(errcode.Internal, err, "The directory of template %s is not a directory; remove it by hand.", name)
	}
	return d, true, nil
}

// openTemplate opens an existing template: its directory and its record. A directory without
// template.json is a template being created or removed, and does not exist.
func (s *Store) openTemplate(name string) (*os.File, *templateRecord, error) {
	if err := ValidateName(name); err != nil {
		return nil, nil, err
	}
	d, found, err := s.openTemplateDir(name)
	if err != nil {
		return nil, nil, err
	}
	if !found {
		return nil, nil, templateNotFound(name)
	}
	rec, err := readTemplateRecord(d)
	if err != nil || rec == nil {
		d.Close()
		if err == nil {
			err = templateNotFound(name)
		}
		return nil, nil, err
	}
	if rec.Name != name {
		d.Close()
		return nil, nil, badRecord(TemplateRecordName, "names template %q in the directory of %q", rec.Name, name)
	}
	return d, rec, nil
}

func readTemplateRecord(d *os.File) (*templateRecord, error) {
	data, found, err := readRecordFile(d, TemplateRecordName)
	if err != nil || !found {
		return nil, err
	}
	return decodeTemplate(data)
}

// writeRecord writes a record durably and reports step. A write that fails leaves the
// record as it was: one that did not exist before is removed again if the failure came after
// its rename (the directory's fsync), so that a failed write never leaves a record (a
// template, a lease, a tombstone) the caller was told is not there. If that removal fails
// too, the record stays, whole, and Check judges it as any other.
func (s *Store) writeRecord(dir *os.File, name string, v any, step string) error {
	data, err := record.Encode(v)
	if err != nil {
		return err
	}
	_, lerr := platform.LstatAt(dir, name)
	fresh := errors.Is(lerr, fs.ErrNotExist)
	if err := s.opts.FS.WriteFileDurableAt(dir, name, data, recordPerm); err != nil {
		if fresh {
			if _, serr := platform.LstatAt(dir, name); serr == nil {
				if uerr := s.removeEntry(dir, name, ""); uerr != nil {
					err = errors.Join(err, fmt.Errorf("template: undoing the failed write of %s: %w", name, uerr))
				}
			}
		}
		return s.storage(recordErr(name, err))
	}
	if step != "" {
		s.synced(step)
	}
	return nil
}

// removeEntry unlinks name in dir and fsyncs dir; a missing entry is not an error (and makes
// no step).
func (s *Store) removeEntry(dir *os.File, name, step string) error {
	err := s.opts.FS.UnlinkAt(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("template: remove %s: %w", name, err)
	}
	if err := s.opts.FS.SyncDir(dir); err != nil {
		return err
	}
	if step != "" {
		s.synced(step)
	}
	return nil
}

// removeDir removes the directory name in dir and fsyncs dir; missing is not an error.
func (s *Store) removeDir(dir *os.File, name, step string) error {
	err := s.opts.FS.RmdirAt(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.opts.FS.SyncDir(dir); err != nil {
		return err
	}
	if step != "" {
		s.synced(step)
	}
	return nil
}

func randomUID() string { return naming.RandomHex(8) }
