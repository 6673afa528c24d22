package supervisor

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// A fork of a running microVM (a [runtime.MemoryCapturer]'s sandbox) runs on from the
// source's memory as well as its disk (docs/checkpoints.md, "Fork of a running microVM"). The
// source is frozen while its memory and device state are saved with a copy of its disk
// overlay, as a memory capture saves them ([runtime.LiveLayerer.OpenLiveLayer]: a snapshot in
// a detached tmpfs), and thawed: that is the reported freeze. Each fork is then provisioned
// (pending, so a crash removes it whole) with the saved state as its own directory
// [runtime.ForkStateName], the first fork's a copy and every later one's hard links to the
// same files (the links are the forks' hold on them: no delete of the source or of another
// fork removes what a fork restores or backs onto), a restore mark, and started: its launch
// restores the state as a clone's restores its generation's, its disk a new overlay over the
// state's frozen disk, and the network the launch gives it (its own address and MAC, which
// the guest is told) replaces the source's.

// forkMemory forks the running microVM that cs locks into one sandbox for each of ids.
func (s *Supervisor) forkMemory(ctx context.Context, cs *checkpointSession, ids []string) (*ForkResult, error) {
	l, cfg, r, rt := cs.l, cs.cfg, cs.r, cs.rt
	id := l.ID()
	if err := s.checkMemoryFork(l, cfg, r, rt); err != nil {
		return nil, err
	}
	p, err := pauserOf(rt)
	if err != nil {
		return nil, errcode.Wrap(errcode.CheckpointUnsupported, err, "Sandbox %s is running and this server cannot freeze it for a fork.", id)
	}
	live, ok := rt.(runtime.LiveLayerer) // a MemoryCapturer is one
	if !ok {
		return nil, errcode.New(errcode.CheckpointUnsupported, "Sandbox %s runs on the %s runtime, which cannot save a running sandbox for a fork.", id, rt.Kind())
	}
	frozenAt := time.Now()
	if err := p.Freeze(ctx, id, l.Dir()); err != nil {
		s.thawAfterCapture(ctx, p, l)
		return nil, errcode.Wrap(errcode.TransitionInProgress, err, "Sandbox %s could not be frozen for its fork and runs on; retry.", id)
	}
	s.crash("fork-frozen")
	savedAt := time.Now().UTC()
	state, err := openSnapshotLayer(ctx, live, l, cfg.DiskMB > 0)
	s.thawAfterCapture(ctx, p, l)
	frozen := time.Since(frozenAt)
	if err != nil {
		return nil, s.liveLayerErr(id, err)
	}
	defer state.Close()
	// A source on a checkpoint chain, or a fork, has a disk that backs onto files of its own
	// directory, which its forks would name without holding: the snapshot's disk is made to
	// back onto the image's base disk, the chain's clusters copied into it, after the thaw
	// (the chain's files are frozen; the copy is the snapshot's).
	if f, ok := rt.(runtime.SnapshotFlattener); ok {
		if err := s.flattenSnapshot(ctx, f, state, fmt.Sprintf("The saved disk of sandbox %s could not be made to stand on its image alone for its forks; it runs on. Retry the fork.", id)); err != nil {
			return nil, err
		}
	}
	s.crash("fork-point")
	res := &ForkResult{FreezeMS: frozen.Milliseconds()}
	var made []string
	shared := "" // the fork-state of a fork made, whose files the next ones link
	for _, fid := range ids {
		var dir string
		st, err := s.forkOne(ctx, cfg, fid, func(fl *store.Lock) error {
			dir = filepath.Join(fl.Dir(), runtime.ForkStateName)
			if err := adoptForkState(dir, state, shared); err != nil {
				return err
			}
			return writeForkRestore(fl.Dir(), id, savedAt)
		})
		res.Forks = append(res.Forks, ForkOutcome{ID: fid, Status: st, Err: err})
		if err == nil {
			made = append(made, fid)
			shared = dir
		}
	}
	s.emitForked(id, made)
	return res, nil
}

// checkMemoryFork refuses, before anything is frozen, the forks of a microVM that are not
// built: of one that is not running (a stopped one is forked by its disk, forkDisk; a paused
// one's memory may be released) or that mounts volumes (QEMU cannot save virtio-fs). A
// source on a checkpoint chain, or a fork itself, is forked: the snapshot's disk is made to
// back onto the base disk alone ([runtime.SnapshotFlattener]), so a fork names nothing of
// its source's directory.
func (s *Supervisor) checkMemoryFork(l *store.Lock, cfg *store.Config, r reconciled, rt runtime.Runtime) error {
	id := l.ID()
	switch {
	case r.state != StateRunning:
		return errcode.New(errcode.CheckpointUnsupported, "Sandbox %s is a %s sandbox that is not running, and a microVM is forked with its memory, while it runs; start it, then fork it.", id, rt.Kind())
	case r.paused:
		return errcode.New(errcode.SandboxPaused, "Sandbox %s is paused; resume it, then fork it (a microVM is forked with its memory, while it runs).", id)
	case len(cfg.Volumes) > 0:
		return errcode.New(errcode.CheckpointUnsupported, "Sandbox %s is a microVM that mounts volumes; its fork saves its memory, and its volumes are virtio-fs devices, which QEMU cannot save. Fork a microVM without volumes.", id)
	}
	// An interrupted checkpoint operation is finished first: the chain the snapshot reads
	// must be settled.
	_, err := s.chainLowers(l)
	return err
}

// isFork reports whether the sandbox in dir is a fork of a microVM: it has a fork-state.
func isFork(dir string) bool {
	fi, err := os.Lstat(filepath.Join(dir, runtime.ForkStateName))
	return err == nil && fi.IsDir()
}

// forkLowers is the layer a microVM's fork runs over, its fork-state (a memory state, as a
// clone's generation is), or nil for a sandbox that is no fork.
func forkLowers(dir string) []string {
	if !isFork(dir) {
		return nil
	}
	return []string{filepath.Join(dir, runtime.ForkStateName)}
}

// adoptForkState makes dir the fork's saved state: hard links to the files of shared (a
// fork-state of the same fork, already made) when there is one and they link, else copies
// of the files in state (the snapshot's directory). It is made under the fork's pending
// provision, so a crash leaves nothing of it that the next start-up keeps.
func adoptForkState(dir string, state *os.File, shared string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	d, err := platform.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	// The runtime's files, whatever they are: the supervisor does not look into a state.
	names, err := platform.ReadDirNames(state)
	if err != nil {
		return err
	}
	for _, name := range names {
		if shared != "" && os.Link(filepath.Join(shared, name), filepath.Join(dir, name)) == nil {
			continue
		}
		if err := copyStateFile(d, state, name); err != nil {
			return fmt.Errorf("copying the saved state's %s: %w", name, err)
		}
	}
	if err := platform.SyncDir(d); err != nil {
		return err
	}
	return platform.SyncDirPath(filepath.Dir(dir))
}

// copyStateFile copies the file name of the directory from into a new file of to, synced.
func copyStateFile(to, from *os.File, name string) error {
	src, err := platform.OpenFileAt(from, name, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer src.Close()
	_ = platform.UnlinkAt(to, name) // a link that failed halfway leaves nothing, but be sure
	dst, err := platform.OpenFileAt(to, name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer dst.Close()
	if _, err := io.Copy(dst, src); err != nil {
		return err
	}
	return dst.Sync()
}

// forkRestoreFor is the restore of a fork's saved state, with the guest's clock advanced by
// the time since the save (0 if the host's clock went back).
func forkRestoreFor(rr *restoreRecord) *runtime.Restore {
	return &runtime.Restore{ClockAdvance: max(0, time.Since(rr.Fork.SavedAt))}
}

// writeForkRestore marks the fork in dir, of the sandbox source, to restore its saved state
// at its next start.
func writeForkRestore(dir, source string, savedAt time.Time) error {
	return writeRestoreRecord(dir, &restoreRecord{Format: restoreFormat, Fork: &forkRestore{Source: source, SavedAt: savedAt}})
}

// checkForkRestore checks that the fork configured as cfg, in dir, holds the saved state its
// restore mark asks for.
func checkForkRestore(dir string, cfg *store.Config) error {
	if cfg.Template != nil || !isFork(dir) {
		return errcode.New(errcode.Internal, "Sandbox %s is to restore a fork's saved state, which it does not hold; delete it.", cfg.ID)
	}
	return nil
}
