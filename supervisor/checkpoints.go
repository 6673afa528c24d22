package supervisor

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// The checkpoints of a sandbox (package checkpoint, docs/checkpoints.md) are taken, listed,
// deleted and rolled back to here, each under the sandbox's lifecycle lock; the mechanism
// and its crash guarantees are the package's, the orchestration (freezing, stopping and
// starting the sandbox around it) is this file's.

// checkpointsOf returns the checkpoints of the sandbox l locks, or checkpoint-unsupported
// for a runtime that has none. A microVM's ([runtime.FileLayerer]) are of its disk alone
// (docs/checkpoints.md): a clone of a template, whose disk backs onto its generation's, has
// none; a fork of a running microVM has, its layers' disks flattened onto the image's base
// disk (forkcheckpoint.go).
func (s *Supervisor) checkpointsOf(l *store.Lock, cfg *store.Config) (*checkpoint.Sandbox, runtime.Runtime, error) {
	rt, err := s.runtimeFor(cfg)
	if err != nil {
		return nil, nil, err
	}
	cp := s.checkpointSandbox(l)
	if fl, ok := rt.(runtime.FileLayerer); ok {
		if cfg.Template != nil {
			return nil, nil, errcode.New(errcode.CheckpointUnsupported, "Sandbox %s is a %s sandbox cloned from template %s: its disk backs onto its generation's, which a checkpoint would name without a lease, so its checkpoints are not implemented; checkpoint a %s sandbox that is no clone.", l.ID(), rt.Kind(), cfg.Template.Template, rt.Kind())
		}
		cp.File = fl.LayerFile()
		return cp, rt, nil
	}
	if _, live := rt.(runtime.LiveLayerer); !live || capturesMemory(rt) {
		return nil, nil, errcode.New(errcode.CheckpointUnsupported, "Sandbox %s runs on the %s runtime, which has no checkpoints, rollback or fork yet; use a sandbox of the namespace runtime.", l.ID(), rt.Kind())
	}
	cp.Disk = cfg.DiskMB > 0
	return cp, rt, nil
}

// checkpointSession is a sandbox locked for an operation on its checkpoints (a checkpoint, a
// listing, a deletion, a rollback, a fork): reattached, which finishes or undoes an
// interrupted one, and with its checkpoints on its runtime.
type checkpointSession struct {
	l   *store.Lock
	cfg *store.Config
	r   reconciled
	cp  *checkpoint.Sandbox
	rt  runtime.Runtime
}

// lockCheckpoints locks sandbox id for an operation on its checkpoints; the caller unlocks
// cs.l (s.unlock).
func (s *Supervisor) lockCheckpoints(ctx context.Context, id string) (*checkpointSession, error) {
	l, cfg, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, err
	}
	cs := &checkpointSession{l: l, cfg: cfg}
	if cs.r, err = s.reattach(ctx, l); err == nil {
		cs.cp, cs.rt, err = s.checkpointsOf(l, cfg)
	}
	if err != nil {
		s.unlock(l)
		return nil, err
	}
	return cs, nil
}

// openUpperFor sets how cp's copies open the writable layer of a sandbox with a disk of its
// own (a sandbox without one is read in its state directory): for a live launch (running or
// paused), a snapshot of its disk, synced through its overlay (the runtime's LiveLayerer),
// after which a running one is thawed while the copy reads the snapshot; for a stopped
// one, a mount of its disk, or nothing if it never ran.
func (s *Supervisor) openUpperFor(ctx context.Context, cp *checkpoint.Sandbox, rt runtime.Runtime, l *store.Lock, live bool) {
	if !cp.Disk {
		return
	}
	cp.UpperIsSnapshot = live
	cp.OpenUpper = func() (*os.File, error) {
		if live {
			f, _, err := rt.(runtime.LiveLayerer).OpenLiveLayer(ctx, l.ID(), l.Dir(), true)
			if err != nil {
				return nil, s.liveLayerErr(l.ID(), err)
			}
			return f, nil
		}
		f, err := rt.OpenLayer(l.Dir(), true)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return f, err
	}
}

// liveLayerErr is layerError for the live layer of a disk of its own. The disk is a loop
// device over a sparse image on the state root: when the state root is full, the sync of the
// disk's writes fails with EIO, not ENOSPC, which would read as a state root failing its
// I/O. A probe of the state root tells the two apart, and a full one answers storage-full.
func (s *Supervisor) liveLayerErr(id string, err error) error {
	if errors.Is(err, syscall.EIO) {
		if perr := probeStorage(s.store.Root()); errcode.StorageFaultOf(perr) == errcode.FaultFull {
			return s.storageErr(errors.Join(perr, err))
		}
	}
	return layerError(id, err)
}

func (s *Supervisor) checkpointSandbox(l *store.Lock) *checkpoint.Sandbox {
	// What a sweep discards goes to the store's trash: a rename under the lock, deleted by
	// the janitor after it.
	return &checkpoint.Sandbox{Dir: l.Dir(), Crash: s.crash, Discard: l.Discard}
}

// chainLowers returns the layers of the sandbox's checkpoint chain, top first, which lie
// between its upper and its generation or image. An interrupted operation that reattach
// could not finish (a full state root: see recoverCheckpoints) is finished first, or the
// launch or capture that asks fails with its error: the chain is not settled until then.
func (s *Supervisor) chainLowers(l *store.Lock) ([]string, error) {
	cp := s.checkpointSandbox(l)
	if _, err := cp.Recover(); err != nil {
		return nil, errcode.Storage(err, s.store.Root())
	}
	return cp.Lowers()
}

// sandboxLowers returns every layer of the sandbox below its upper that is not its image's:
// its checkpoint chain, then its generation's payload if it is a clone, or its fork-state if
// it is a fork of a running microVM (whose restore or disk it is) that stands on no chain.
func (s *Supervisor) sandboxLowers(l *store.Lock, cfg *store.Config) ([]string, error) {
	chain, err := s.chainLowers(l)
	if err != nil {
		return nil, err
	}
	clone, err := s.cloneLowers(l, cfg)
	if err != nil {
		return nil, err
	}
	if len(chain) > 0 {
		// A fork on a chain: its layers' disks stand on the image alone (forkcheckpoint.go).
		return append(chain, clone...), nil
	}
	return append(clone, forkLowers(l.Dir())...), nil
}

// recoverCheckpoints finishes or undoes a checkpoint operation that a crash interrupted, and
// sweeps what earlier ones threw away. Called under the lifecycle lock by reattach, before
// anything else looks at the sandbox's files.
//
// With settle, as the start-up's reconciliation of each sandbox asks, it always does the whole
// of it (a crash's leftovers: a rollback's unrecorded upper, a copy's staging, layers no
// chain names). Without, as every later transition and exec admission asks, it reads the
// manifest alone unless an operation is recorded: within a running server one is left
// recorded only when the state root refused its end (below), and what an operation throws
// away its own sweep takes, so the hot path pays one read instead of a sweep.
//
// A recovery that the state root's storage fault stops (a full one: the undo of a copy that
// ran out of space cannot write the manifest that clears its record) leaves the operation
// recorded, and the transition goes on: a stop, a pause or a delete (which frees space) does
// not touch the sandbox's layers, and what does (a launch, a capture: chainLowers; the
// checkpoint operations, which refuse while one is pending) finishes the recovery first.
// Otherwise a full state root would refuse the very deletes that free it.
func (s *Supervisor) recoverCheckpoints(l *store.Lock, settle bool) error {
	cp := s.checkpointSandbox(l)
	mustRecover, had := settle, false
	var err error
	if !settle {
		mustRecover, err = cp.Pending()
	}
	if err == nil && mustRecover {
		had, err = cp.Recover()
	}
	if err != nil && errcode.StorageFaultOf(err) != errcode.NoStorageFault {
		s.log.Warn("a checkpoint operation is not finished: the state root refused it; the next start of the sandbox finishes it", "sandbox", l.ID(), "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	if !mustRecover {
		return nil
	}
	if had {
		s.log.Warn("finished a checkpoint operation that a crash interrupted", "sandbox", l.ID())
	}
	return cp.Sweep()
}

// Checkpoint takes the checkpoint name of a sandbox: a stopped one's upper is rotated into a
// layer (no copy), a running one is frozen while its upper is copied (see
// docs/checkpoints.md), a paused one is copied as it is.
func (s *Supervisor) Checkpoint(ctx context.Context, id, name string) (c *checkpoint.Checkpoint, err error) {
	defer s.observe("checkpoint", time.Now(), &err)
	if c, err = s.checkpoint(ctx, id, name); err == nil {
		s.emit(Event{Type: EventCheckpointCreated, Sandbox: id, Checkpoint: c.Name})
	}
	return c, err
}

func (s *Supervisor) checkpoint(ctx context.Context, id, name string) (*checkpoint.Checkpoint, error) {
	if err := checkpoint.ValidateName(name); err != nil {
		return nil, err
	}
	cs, err := s.lockCheckpoints(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(cs.l)
	l, r, cp, rt := cs.l, cs.r, cs.cp, cs.rt
	noHold := func() (func(), error) { return func() {}, nil }
	s.openUpperFor(ctx, cp, rt, l, r.state == StateRunning)
	// A fork's layers stand on the image alone, not on its fork-state (forkcheckpoint.go).
	fork := cp.File != "" && isFork(l.Dir())
	var flatten func(dir string) (int64, error)
	if fork {
		if err := checkForkCheckpoint(l); err != nil {
			return nil, err
		}
		flatten = func(dir string) (int64, error) { return s.flattenForkLayer(ctx, rt, id, dir, cp.File) }
		cp.AddToLayer = flatten
	}
	switch {
	case r.mismatch:
		return nil, mismatchError(id)
	case r.state != StateRunning && cp.Disk:
		return cp.Copy(ctx, name, s.checkpointLimits, noHold)
	case r.state != StateRunning:
		if fork {
			if err := s.flattenForkOverlay(ctx, rt, l, cp.File); err != nil {
				return nil, err
			}
		}
		return cp.Rotate(name, s.checkpointLimits)
	case r.paused:
		return cp.Copy(ctx, name, s.checkpointLimits, func() (func(), error) { return func() {}, nil })
	}
	p, err := pauserOf(rt)
	if err != nil {
		return nil, errcode.Wrap(errcode.CheckpointUnsupported, err, "Sandbox %s is running and this server cannot freeze it for a checkpoint; stop it before taking one.", id)
	}
	// A running microVM's checkpoint holds its memory too (checkpointmemory.go), saved
	// while it stands for the copy of its disk.
	ms := s.memorySaverFor(rt, cs.cfg)
	var mem *os.File
	defer func() {
		if mem != nil {
			mem.Close()
		}
	}()
	// The memory is written into the checkpoint's layer before it is committed, so that it
	// counts in the checkpoint's size and its bound, and a crash before the commit undoes it
	// with the copy.
	cp.AddToLayer = func(dir string) (int64, error) {
		var flat int64
		if flatten != nil {
			var err error
			if flat, err = flatten(dir); err != nil {
				return 0, err
			}
		}
		if mem == nil {
			return flat, nil
		}
		n, err := keepCheckpointMemory(dir, mem)
		if err != nil {
			if errcode.StorageFaultOf(err) != errcode.NoStorageFault {
				return 0, s.storageErr(err)
			}
			return 0, errcode.Wrap(errcode.Internal, err, "The memory of sandbox %s could not be kept in its checkpoint, which is not taken; it runs on. Retry the checkpoint.", id)
		}
		s.crash("checkpoint-memory")
		return flat + n, nil
	}
	c, err := cp.Copy(ctx, name, s.checkpointLimits, func() (func(), error) {
		if err := p.Freeze(ctx, id, l.Dir()); err != nil {
			s.thawAfterCapture(ctx, p, l)
			return nil, errcode.Wrap(errcode.TransitionInProgress, err, "Sandbox %s could not be frozen for its checkpoint and runs on; retry.", id)
		}
		s.crash("checkpoint-frozen")
		if ms != nil {
			var err error
			if mem, err = ms.SaveMemory(ctx, id, l.Dir()); err != nil {
				s.thawAfterCapture(ctx, p, l)
				return nil, errcode.Wrap(errcode.Internal, err, "The memory of sandbox %s could not be saved for its checkpoint; it runs on. Retry the checkpoint.", id)
			}
		}
		return func() { s.thawAfterCapture(ctx, p, l) }, nil
	})
	return c, err
}

// Checkpoints lists a sandbox's checkpoints, oldest first.
func (s *Supervisor) Checkpoints(ctx context.Context, id string) ([]checkpoint.Checkpoint, error) {
	cs, err := s.lockCheckpoints(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(cs.l)
	m, err := cs.cp.Manifest()
	if err != nil {
		return nil, err
	}
	return m.Checkpoints, nil
}

// DeleteCheckpoint removes a sandbox's checkpoint name, and the layers that nothing else
// names.
func (s *Supervisor) DeleteCheckpoint(ctx context.Context, id, name string) (err error) {
	defer s.observe("checkpoint-delete", time.Now(), &err)
	cs, err := s.lockCheckpoints(ctx, id)
	if err != nil {
		return err
	}
	defer s.unlock(cs.l)
	if err := cs.cp.Delete(name); err != nil {
		return err
	}
	s.emit(Event{Type: EventCheckpointDeleted, Sandbox: id, Checkpoint: name})
	if err := cs.cp.Sweep(); err != nil {
		s.log.Warn("discarding a deleted checkpoint's layers; the next operation on the sandbox retries", "sandbox", id, "err", err)
	}
	return nil
}

// Rollback makes a sandbox's files those of its checkpoint name, in place: its id,
// configuration, network, ports and links stay. A running sandbox is stopped (its processes
// are killed: they hold the files of the point being left) and started again on the
// checkpoint's files, a microVM's checkpoint that holds its memory restored (its processes
// run on from the point); a stopped one stays stopped (and restores it at its next start).
// It returns the checkpoint.
func (s *Supervisor) Rollback(ctx context.Context, id, name string) (c *checkpoint.Checkpoint, err error) {
	defer s.observe("rollback", time.Now(), &err)
	if err := checkpoint.ValidateName(name); err != nil {
		return nil, err
	}
	cs, err := s.lockCheckpoints(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(cs.l)
	l, r, cp := cs.l, cs.r, cs.cp
	m, err := cp.Manifest()
	if err != nil {
		return nil, err
	}
	if m.Find(name) == nil {
		return nil, errcode.New(errcode.CheckpointNotFound, "Sandbox %s has no checkpoint named %s; list its checkpoints to see their names.", id, name)
	}
	running := r.state == StateRunning
	if running {
		if r.mismatch {
			return nil, mismatchError(id)
		}
		o, err := s.stopLocked(ctx, l, r.rec, true)
		if err != nil {
			return nil, err
		}
		s.emit(Event{Type: EventStopped, Sandbox: id, State: StateStopped, Exit: o})
		s.crash("rollback-stopped")
	}
	if c, err = cp.Rollback(name); err != nil {
		return nil, err
	}
	// A checkpoint that holds the VM's memory is restored at the next start, the rolled-back
	// one below if it ran, and any earlier restore mark is void: the files are another point's.
	if err := s.markRollbackRestore(l, cs.rt, cp, c); err != nil {
		return nil, err
	}
	// The files are the checkpoint's from here on, whether or not a running sandbox starts
	// again: the event says so in the state it is left in (its sandbox.started follows).
	state := StateStopped
	if r.state != StateRunning {
		state = r.state
	}
	s.emit(Event{Type: EventRolledBack, Sandbox: id, State: state, Checkpoint: c.Name})
	if running {
		if _, err := s.startLocked(ctx, l); err != nil {
			code := errcode.Of(err)
			if code == "" {
				code = errcode.Internal
			}
			return nil, errcode.Wrap(code, err, "Sandbox %s was rolled back to %s but did not start again; start it.", id, name)
		}
	}
	if err := cp.Sweep(); err != nil {
		s.log.Warn("discarding what a rollback threw away; the next operation on the sandbox retries", "sandbox", id, "err", err)
	}
	return c, nil
}
