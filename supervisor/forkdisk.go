package supervisor

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// A fork of a stopped microVM (docs/checkpoints.md, "Fork of a stopped microVM") is of its
// disk alone: no memory runs, so each fork boots. Each fork gets its own copy of the disk the
// source would boot (its overlay, or, when a rollback threw that away, the top disk of its
// checkpoint chain), made to back onto the image's base disk alone
// ([runtime.SnapshotFlattener]: the chain's or fork-state's clusters copied into it), as its
// own overlay: a sandbox that has run before, whose next start boots that disk. A fork's disk
// is written by its VM, so it is a copy per fork, not a link. Each is made under the fork's
// pending provision, so a crash removes a fork half made whole.

// forkDisk forks the stopped microVM that cs locks into one sandbox for each of ids.
func (s *Supervisor) forkDisk(ctx context.Context, cs *checkpointSession, ids []string) (*ForkResult, error) {
	l, cfg, cp, rt := cs.l, cs.cfg, cs.cp, cs.rt
	id := l.ID()
	flat, ok := rt.(runtime.SnapshotFlattener)
	if !ok {
		return nil, errcode.New(errcode.CheckpointUnsupported, "Sandbox %s runs on the %s runtime, whose stopped sandboxes cannot be forked; start it, then fork it.", id, rt.Kind())
	}
	src, err := s.bootDisk(l, cp.File)
	if err != nil {
		return nil, err
	}
	s.crash("fork-point")
	res := &ForkResult{}
	var made []string
	for _, fid := range ids {
		st, err := s.forkOne(ctx, cfg, fid, func(fl *store.Lock) error {
			if src == "" {
				return nil // the source never ran: its fork boots the image as it would
			}
			if err := copyBootDisk(ctx, flat, src, fl.Dir(), cp.File); err != nil {
				return err
			}
			s.crash("fork-copied")
			return nil
		})
		res.Forks = append(res.Forks, ForkOutcome{ID: fid, Status: st, Err: err})
		if err == nil {
			made = append(made, fid)
		}
	}
	s.emitForked(id, made)
	return res, nil
}

// bootDisk is the disk (a file named name) the stopped sandbox l locks would boot: its own,
// or the top of its checkpoint chain that holds one when it has none (a rollback threw it
// away; its next start makes a new one over that), or its fork-state's, or "" when it never
// ran.
func (s *Supervisor) bootDisk(l *store.Lock, name string) (string, error) {
	own := filepath.Join(l.Dir(), name)
	if fi, err := os.Lstat(own); err == nil && fi.Mode().IsRegular() {
		return own, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	chain, err := s.chainLowers(l)
	if err != nil {
		return "", err
	}
	// A fork of a running microVM that has not booted its own disk yet boots its fork-state's.
	for _, layer := range append(chain, forkLowers(l.Dir())...) {
		p := filepath.Join(layer, name)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", nil
}

// copyBootDisk copies the disk src into the fork's state directory dir as name, synced, and
// makes it back onto the image's base disk alone.
func copyBootDisk(ctx context.Context, flat runtime.SnapshotFlattener, src, dir, name string) error {
	from, err := platform.OpenDir(filepath.Dir(src))
	if err != nil {
		return err
	}
	defer from.Close()
	to, err := platform.OpenDir(dir)
	if err != nil {
		return err
	}
	defer to.Close()
	if name != filepath.Base(src) {
		return errors.New("supervisor: a fork's disk is named as its source's")
	}
	if err := copyStateFile(to, from, name); err != nil {
		return err
	}
	if err := flat.FlattenSnapshot(ctx, to); err != nil {
		return err
	}
	return platform.SyncDir(to)
}
