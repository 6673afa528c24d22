package supervisor

import (
	"context"
	"maps"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store"
)

// MaxForks is the most sandboxes one fork makes.
const MaxForks = 16

// ForkRequest is a fork of a sandbox: Count new sandboxes (1 to MaxForks), with the ids IDs
// if given (as many as Count; Count may then be 0), else ids the server chooses.
type ForkRequest struct {
	Count int
	IDs   []string
}

// ForkResult is what a fork made: how long the source was frozen (0 for a stopped source)
// and each fork's outcome, in the order of the ids.
type ForkResult struct {
	FreezeMS int64
	Forks    []ForkOutcome
}

// ForkOutcome is one fork: its id and status, or why it failed (each fork succeeds or fails
// on its own).
type ForkOutcome struct {
	ID     string
	Status *Status
	Err    error
}

func (req ForkRequest) ids() ([]string, error) {
	if req.Count > 0 && len(req.IDs) > 0 {
		// The contract takes one of them (ForkRequest), so that they cannot disagree.
		return nil, errcode.Invalid("ids", "A fork takes a count or ids, not both; ids makes one fork for each.")
	}
	n := req.Count
	if n == 0 {
		n = len(req.IDs)
	}
	if n < 1 || n > MaxForks {
		return nil, errcode.Invalid("count", "A fork makes 1 to %d sandboxes; ask for a count in that range.", MaxForks)
	}
	if len(req.IDs) == 0 {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = NewSandboxID()
		}
		return ids, nil
	}
	seen := map[string]bool{}
	for _, id := range req.IDs {
		if err := store.ValidateID(id); err != nil {
			return nil, err
		}
		if seen[id] {
			return nil, errcode.Invalid("ids", "The id %s is given twice; give each fork an id of its own.", id)
		}
		seen[id] = true
	}
	return req.IDs, nil
}

// Fork makes new sandboxes that run on from the files of sandbox id as they are now
// (docs/checkpoints.md). A running source is frozen while its upper is copied (the
// reported freeze) and runs on; a stopped one's upper is rotated into its chain. Each fork
// is provisioned with the source's configuration (image, resources, env, labels, network
// policy; not its lifetime or sleep policy), gets the source's layers by hard links (its
// lease on them: no delete of the source or its checkpoints removes what a fork names), and
// is started; a fork's create is all or nothing across crashes, as a create with start is.
// The source's lock is held throughout, so no other transition of the source interleaves.
// A running microVM forks with its memory instead ([Supervisor.forkMemory]), a stopped one
// into copies of its disk ([Supervisor.forkDisk]).
func (s *Supervisor) Fork(ctx context.Context, id string, req ForkRequest) (res *ForkResult, err error) {
	defer s.observe("fork", time.Now(), &err)
	ids, err := req.ids()
	if err != nil {
		return nil, err
	}
	cs, err := s.lockCheckpoints(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(cs.l)
	l, cfg, r, cp, rt := cs.l, cs.cfg, cs.r, cs.cp, cs.rt
	if r.mismatch {
		return nil, mismatchError(id)
	}
	if cp.File != "" && r.state != StateRunning {
		// A stopped microVM: its forks boot copies of its disk (forkdisk.go).
		return s.forkDisk(ctx, cs, ids)
	}
	if cp.File != "" {
		// A microVM: its forks run on from its memory (forkmemory.go).
		return s.forkMemory(ctx, cs, ids)
	}
	running := r.state == StateRunning
	s.openUpperFor(ctx, cp, rt, l, running)
	hold := func() (func(), error) { return func() {}, nil }
	if running && !r.paused {
		p, err := pauserOf(rt)
		if err != nil {
			return nil, errcode.Wrap(errcode.CheckpointUnsupported, err, "Sandbox %s is running and this server cannot freeze it for a fork; stop it before forking it.", id)
		}
		hold = func() (func(), error) {
			if err := p.Freeze(ctx, id, l.Dir()); err != nil {
				s.thawAfterCapture(ctx, p, l)
				return nil, errcode.Wrap(errcode.TransitionInProgress, err, "Sandbox %s could not be frozen for its fork and runs on; retry.", id)
			}
			s.crash("fork-frozen")
			return func() { s.thawAfterCapture(ctx, p, l) }, nil
		}
	}
	layers, frozen, done, err := cp.Point(ctx, running, hold)
	if err != nil {
		return nil, err
	}
	defer done()
	s.crash("fork-point")
	// A clone's generation is linked too: the forks are no clones, and hold no lease of
	// the template store, only links to its files.
	clone, err := s.cloneLowers(l, cfg)
	if err != nil {
		return nil, err
	}
	layers = append(layers, clone...)
	res = &ForkResult{FreezeMS: frozen.Milliseconds()}
	var made []string
	for _, fid := range ids {
		st, err := s.forkOne(ctx, cfg, fid, func(l *store.Lock) error {
			return s.checkpointSandbox(l).Adopt(layers)
		})
		res.Forks = append(res.Forks, ForkOutcome{ID: fid, Status: st, Err: err})
		if err == nil {
			made = append(made, fid)
		}
	}
	s.emitForked(id, made)
	return res, nil
}

// emitForked announces the forks made of sandbox id: after each fork's own sandbox.created
// and sandbox.started; a fork none of whose sandboxes was made reports nothing.
func (s *Supervisor) emitForked(id string, made []string) {
	if len(made) > 0 {
		s.emit(Event{Type: EventForked, Sandbox: id, Forks: made})
	}
}

// forkOne provisions the fork fid of the sandbox configured as src, gives it what it runs on
// from with adopt (the source's layers, or a microVM's saved state), and starts it.
func (s *Supervisor) forkOne(ctx context.Context, src *Config, fid string, adopt func(*store.Lock) error) (*Status, error) {
	cfg := Config{
		ID:        fid,
		Image:     src.Image,
		Resources: src.Resources,
		DiskMB:    src.DiskMB,
		Env:       maps.Clone(src.Env),
		Labels:    maps.Clone(src.Labels),
		Network:   src.Network,
		Runtime:   src.Runtime,
	}
	// Each fork is a started create for the node's limits (a cluster node's capacity,
	// docs/cluster.md): admitted on its own, so a fork past the room fails that fork alone.
	hold := &admissionHold{admission: s.admission, id: fid}
	defer hold.release()
	if err := hold.admit(src.Resources); err != nil {
		return nil, err
	}
	var st *Status
	_, err := s.provision(ctx, cfg, provisioning{pending: true}, func(l *store.Lock) (err error) {
		if err := adopt(l); err != nil {
			cctx, cancel := cleanupContext(ctx)
			defer cancel()
			if derr := s.deprovisionLocked(cctx, l); derr != nil {
				s.log.Error("undoing a fork whose layers could not be linked; the next start-up of bothyd removes it", "sandbox", fid, "err", derr)
			}
			if errcode.StorageFaultOf(err) != errcode.NoStorageFault {
				return s.storageErr(err) // a full state root: 507, as a create's
			}
			return errcode.Wrap(errcode.Internal, err, "Fork %s could not get the source's files or saved state; retry the fork.", fid)
		}
		st, err = s.startCreated(ctx, l)
		return err
	})
	return st, err
}
