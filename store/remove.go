package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// CleanStaging removes the outcome report's staging leftovers (".outcome.json.<random>.tmp")
// from the state directory. Callers use it only when no runtime process of the sandbox's
// launch can still be running — when the next launch begins, when a recovery ends a launch —
// because a running one may be staging its report right now.
func (l *Lock) CleanStaging() error {
	return l.s.storage(l.removeTemps(func(target string) bool { return target == OutcomeName }))
}

// ForeignFilesError is wrapped by a foreign-files error and names the entries.
type ForeignFilesError struct {
	Entries []string
}

func (e *ForeignFilesError) Error() string {
	return "foreign entries in the state directory: " + strings.Join(e.Entries, ", ")
}

// entries is a state directory's content, sorted by what removal does with it.
type entries struct {
	files   []string // the store's files (but the lock and the config), declared files, temp leftovers
	dirs    []string // declared directories
	nfs     []string // removed-but-open files on NFS
	foreign []string
}

func (l *Lock) classify() (entries, error) {
	names, err := platform.ReadDirNames(l.dir)
	if err != nil {
		return entries{}, err
	}
	slices.Sort(names)
	var e entries
	isDir := func(name string) bool {
		st, err := platform.LstatAt(l.dir, name)
		return err == nil && st.IsDir()
	}
	for _, name := range names {
		switch {
		case name == LockName || name == ConfigName:
			// Handled last, in their own order.
		case slices.Contains(storeNames, name):
			if isDir(name) {
				e.foreign = append(e.foreign, name)
				continue
			}
			e.files = append(e.files, name)
		case strings.HasPrefix(name, nfsPrefix):
			e.nfs = append(e.nfs, name)
		default:
			if kind, ok := l.s.declaredKind(name); ok {
				switch {
				case kind == EntryDir:
					e.dirs = append(e.dirs, name)
				case isDir(name):
					// A directory where a file was declared is not what its owner made.
					e.foreign = append(e.foreign, name)
				default:
					e.files = append(e.files, name)
				}
				continue
			}
			if target, ok := platform.IsTempName(name); ok {
				// At removal no process of the sandbox runs and the lock is held, so no durable
				// write of a store record or a declared file can be in flight.
				kind, declared := l.s.declaredKind(target)
				if (slices.Contains(recordNames, target) || (declared && kind == EntryFile)) && !isDir(name) {
					e.files = append(e.files, name)
					continue
				}
			}
			e.foreign = append(e.foreign, name)
		}
	}
	return e, nil
}

// Deprovision removes the sandbox, under this lock, by the removal protocol (see the package
// documentation):
//
//   - it needs the configuration record (else sandbox-not-found) and refuses with
//     sandbox-launched while a runtime record or a launch journal exists;
//   - it removes the store's and the declared files and directories, then the configuration
//     record last, durably;
//   - if foreign entries remain it reports foreign-files naming them and keeps the directory
//     (the sandbox is removed; Unlock then removes the lock file);
//   - otherwise it removes its lock file while holding the lock, then the directory.
//
// When the directory does not empty (an NFS ".nfs*" file of a removed lock file that a waiter
// still holds open, or a lock file that a waiter created meanwhile), it releases the lock and
// waits, up to ctx's deadline, looking every 25 ms: it removes the directory once empty,
// succeeds if the name is gone or names another directory, and reports provisioned-again if a
// provision wrote a configuration record into the directory meanwhile. When the deadline
// passes first it reports transition-in-progress; the sandbox is removed by then and the
// directory goes when its last user leaves.
//
// Once Deprovision has removed the lock file the lock is released, and Unlock does nothing.
func (l *Lock) Deprovision(ctx context.Context) (err error) {
	defer func() { err = l.s.storage(err) }()
	deadline, ok := ctx.Deadline()
	if !ok {
		return errcode.Invalid("timeout", "The operation needs a finite, positive timeout.")
	}
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return fmt.Errorf("store: Deprovision on a released lock of %s", l.id)
	}
	l.mu.Unlock()

	has, err := l.hasConfig()
	if err != nil {
		return err
	}
	if !has {
		return notFound(l.id, fs.ErrNotExist)
	}
	for _, name := range []string{RuntimeName, LaunchName} {
		if _, err := platform.LstatAt(l.dir, name); err == nil {
			return errcode.New(errcode.SandboxLaunched, "Sandbox %s has a launched runtime; stop it before deleting it.", l.id)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}

	e, err := l.classify()
	if err != nil {
		return err
	}
	if err := l.removeEntries(e); err != nil {
		return err
	}
	// The configuration record goes last and durably: until it is gone the sandbox is
	// provisioned, so an interrupted removal leaves a sandbox that removing again finishes.
	if err := l.s.fs.UnlinkAt(l.dir, ConfigName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := l.s.fs.SyncDir(l.dir); err != nil {
		return err
	}
	if len(e.foreign) > 0 {
		return errcode.Wrap(errcode.ForeignFiles, &ForeignFilesError{Entries: e.foreign},
			"Sandbox %s was removed, but its state directory holds entries bothyd does not own (%s); they were kept, remove them by hand.",
			l.id, strings.Join(e.foreign, ", "))
	}

	// The lock file goes while we hold it, so that a waiter that opened it finds, once it has
	// the lock, that the entry no longer names its file.
	l.mu.Lock()
	if err := l.removeLockFile(); err != nil {
		l.mu.Unlock()
		return err
	}
	l.s.hook(hookUnlinked)
	dirID, err := platform.IDOf(l.dir)
	if err != nil {
		l.mu.Unlock()
		return err
	}
	rmErr := l.s.fs.RmdirAt(l.s.sbx, l.id)
	l.released = true
	relErr := l.release()
	l.mu.Unlock()
	switch {
	case rmErr == nil || errors.Is(rmErr, fs.ErrNotExist):
		return errors.Join(l.s.fs.SyncDir(l.s.sbx), relErr)
	case !isNotEmpty(rmErr):
		return errors.Join(rmErr, relErr)
	}
	return l.s.awaitRemoval(ctx, l.id, dirID, deadline)
}

// removeEntries removes the store's and declared entries (not the lock, not the config): it
// moves them into the trash, which [Store.EmptyTrash] deletes after the removal answered, and
// deletes in place what it could not move.
func (l *Lock) removeEntries(e entries) error {
	dirStat, err := platform.StatOf(l.dir)
	if err != nil {
		return err
	}
	for _, name := range e.dirs {
		st, err := platform.LstatAt(l.dir, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		// A declared directory on another device is a mount point (an overlay still mounted,
		// say): removing through it would delete what the mount shows. Refuse instead.
		if st.IsDir() && st.ID.Dev != dirStat.ID.Dev {
			return errcode.New(errcode.SandboxLaunched, "Sandbox %s still has %s mounted; stop it before deleting it.", l.id, name)
		}
	}
	for _, name := range l.moveToTrash(slices.Concat(e.dirs, e.files)) {
		// RemoveAllAt removes links, never what they point to, removes a non-directory under
		// the name as well, holds a bounded number of descriptors however deep the sandbox
		// made its tree, and needs no space, so a delete frees a full disk.
		remove := l.s.fs.UnlinkAt
		if slices.Contains(e.dirs, name) {
			remove = l.s.fs.RemoveAllAt
		}
		if err := remove(l.dir, name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("store: remove %s of %s: %w", name, l.id, err)
		}
	}
	return l.s.fs.SyncDir(l.dir)
}

// awaitRemoval waits, after the lock was released, for the state directory dirID of id to
// empty, and removes it. See Deprovision.
func (s *Store) awaitRemoval(ctx context.Context, id string, dirID platform.FileID, deadline time.Time) error {
	dir, err := platform.OpenDirAt(s.sbx, id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	if cur, err := platform.IDOf(dir); err != nil || cur != dirID {
		// The name already names another directory: ours is gone.
		return err
	}
	timer := time.NewTimer(RetryInterval)
	timer.Stop()
	for {
		st, err := platform.LstatAt(s.sbx, id)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && st.ID != dirID) {
			// Another removal finished it, or the name was removed and made again: ours is gone.
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := platform.LstatAt(dir, ConfigName); err == nil {
			return errcode.New(errcode.ProvisionedAgain,
				"Sandbox %s was removed, but a new sandbox with the same id was created meanwhile; it was left alone.", id)
		}
		err = s.fs.RmdirAt(s.sbx, id)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return s.fs.SyncDir(s.sbx)
		}
		if !isNotEmpty(err) {
			return err
		}
		// A lock file may be left by a waiter that created it and crashed; take it once
		// without waiting: a holder that finds no configuration record removes the lock file
		// (and the directory if that empties it) when it unlocks.
		if _, err := platform.LstatAt(dir, LockName); err == nil {
			l, res, err := s.try(id, false)
			switch {
			case res == Acquired:
				cur, ierr := platform.IDOf(l.dir)
				uerr := l.Unlock()
				if ierr != nil || uerr != nil {
					return errors.Join(ierr, uerr)
				}
				if cur != dirID {
					return nil // the name was made again meanwhile: ours is gone
				}
				// A configuration record appeared: a provision took the lock meanwhile.
				return errcode.New(errcode.ProvisionedAgain,
					"Sandbox %s was removed, but a new sandbox with the same id was created meanwhile; it was left alone.", id)
			case res == Failed && errcode.Of(err) != errcode.SandboxNotFound:
				return err
			}
			// Busy, raced or not found: look again after the interval.
		}
		wait := min(RetryInterval, time.Until(deadline))
		if wait <= 0 {
			return removalPending(id)
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return ctx.Err()
			}
			return removalPending(id)
		}
	}
}

func removalPending(id string) error {
	return errcode.New(errcode.TransitionInProgress,
		"Sandbox %s was removed, but its state directory is still held open by another operation; it goes when that operation ends.", id)
}
