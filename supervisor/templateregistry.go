package supervisor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/template"
)

// GenerationRegistry moves template generations between nodes (store/template/registry
// implements it over an OCI registry; the supervisor links no network client).
type GenerationRegistry interface {
	// Push uploads a generation of the template store and returns its manifest's digest.
	Push(ctx context.Context, tmpl, gen string) (string, error)
	// Pull brings a generation into the template store; concurrent pulls of one generation
	// share one download. template-exists means the store holds it already,
	// template-tombstoned that the cluster tombstoned or retired it.
	Pull(ctx context.Context, tmpl, gen string) error
	// Tombstone records in the registry that a generation was tombstoned (retire false) or
	// retired (true) on this node, for every node to do the same.
	Tombstone(ctx context.Context, tmpl, gen string, retire bool) error
	// Tombstoned says whether the registry holds a generation's tombstone, and whether it
	// is a retirement's.
	Tombstoned(ctx context.Context, tmpl, gen string) (found, retire bool, err error)
	// Current is the template's current generation in the registry (its newest that is
	// not tombstoned), for a clone that names a template this node holds no generation
	// of; template-not-found when the registry holds none.
	Current(ctx context.Context, tmpl string) (string, error)
	// Release lets go of this node's mark on a generation whose copy is gone here (or was
	// never made), and deletes the registry's copy of the generation once it is tombstoned
	// and no node's mark is left. Calling it for a generation held here changes nothing
	// but the deletion's check.
	Release(ctx context.Context, tmpl, gen string) error
	// FlushTombstones pushes the tombstones and retirements of the template store's outbox
	// (template.Store.RecordRemoteTombstone) that this store made, removing each record
	// once the registry holds it (and, unpushed, each whose change was never made here),
	// and returns those it pushed.
	// Records of generations busy says are changing now are left alone.
	FlushTombstones(ctx context.Context, busy func(tmpl, gen string) bool) ([]template.RemoteTombstone, error)
}

// PushState is where the push of a generation captured here stands. It lives in memory: a
// generation captured before the last start of bothyd, or pulled, has none.
type PushState struct {
	State  string // PushPushing, PushPushed or PushFailed
	Digest string // the manifest's digest, once pushed
	Error  string // why it failed
}

// The states of a push.
const (
	PushPushing = "pushing"
	PushPushed  = "pushed"
	PushFailed  = "failed"
)

// pushStates holds the pushes of this process, by "<template>/<generation>".
type pushStates struct {
	mu sync.Mutex
	m  map[string]PushState
}

func (p *pushStates) set(tmpl, gen string, st PushState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]PushState{}
	}
	p.m[tmpl+"/"+gen] = st
}

// PushState returns where the push of a generation captured by this process stands; false
// when it pushed none (no registry, a generation pulled or captured before its start).
func (s *Supervisor) PushState(tmpl, gen string) (PushState, bool) {
	s.pushes.mu.Lock()
	defer s.pushes.mu.Unlock()
	st, ok := s.pushes.m[tmpl+"/"+gen]
	return st, ok
}

// begin marks a push of the generation as under way; false when one is already.
func (p *pushStates) begin(tmpl, gen string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]PushState{}
	}
	if p.m[tmpl+"/"+gen].State == PushPushing {
		return false
	}
	p.m[tmpl+"/"+gen] = PushState{State: PushPushing}
	return true
}

// PushAgain pushes a generation held here that the registry has no tag of (a push that
// failed, or was cut by a crash or a restart; bothyd's sweep finds them: registry.Collect),
// in the caller's goroutine; its state shows as a capture's push does. A push of it under
// way already is left to finish.
func (s *Supervisor) PushAgain(ctx context.Context, tmpl, gen string) error {
	if s.generations == nil {
		return nil
	}
	if !s.pushes.begin(tmpl, gen) {
		return nil
	}
	start := time.Now()
	digest, err := s.generations.Push(ctx, tmpl, gen)
	if err != nil {
		s.pushes.set(tmpl, gen, PushState{State: PushFailed, Error: pushFailure(err)})
		return err
	}
	s.pushes.set(tmpl, gen, PushState{State: PushPushed, Digest: digest})
	s.log.Info("pushed a generation the template registry lacked", "template", tmpl, "generation", gen, "digest", digest, "duration", time.Since(start))
	return nil
}

// pushFailure is why a push failed as the API shows it: the code and the sentence of a
// coded error (whose sentence names its cause already), the error itself otherwise.
func pushFailure(err error) string {
	var e *errcode.Error
	if errors.As(err, &e) {
		return string(e.Code) + ": " + e.Msg
	}
	return err.Error()
}

// pushTimeout bounds one background push of a captured generation.
const pushTimeout = 30 * time.Minute

// pushCaptured pushes a new generation in the background: a capture answers once its
// generation is on this node, and other nodes find it in the registry once the push is
// done. A push that fails is logged, and pushed again by bothyd's next sweep (PushAgain);
// the generation serves this node's clones regardless.
func (s *Supervisor) pushCaptured(tmpl, gen string) {
	if s.generations == nil {
		return
	}
	if !s.pushes.begin(tmpl, gen) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(s.life, pushTimeout)
		defer cancel()
		start := time.Now()
		digest, err := s.generations.Push(ctx, tmpl, gen)
		if err != nil {
			s.pushes.set(tmpl, gen, PushState{State: PushFailed, Error: pushFailure(err)})
			s.log.Warn("pushing a captured generation to the template registry; other nodes cannot clone it until the next sweep pushes it again", "template", tmpl, "generation", gen, "err", err)
			return
		}
		s.pushes.set(tmpl, gen, PushState{State: PushPushed, Digest: digest})
		s.log.Info("pushed a generation to the template registry", "template", tmpl, "generation", gen, "digest", digest, "duration", time.Since(start))
	}()
}

// pullMissing checks the template's name a clone gives, and brings here from the registry
// the generation the clone will want: the one it names, when this node does not hold it; or,
// when it names none, the registry's current generation of the template, when that is newer
// than every generation this node holds (pullCurrent). It runs before the clone takes the
// template store's lock (a pull copies without it, as a capture does); a generation that
// appears meanwhile (another clone's pull) is found by the clone. The pull records the
// generation in the store before it makes it (template.Store.Import).
func (s *Supervisor) pullMissing(ctx context.Context, req CloneRequest) error {
	if err := template.ValidateName(req.Template); err != nil {
		return err
	}
	if s.generations == nil {
		return nil
	}
	now, err := s.templates.Now()
	if err != nil {
		return err
	}
	if req.Generation == "" {
		return s.pullCurrent(ctx, req.Template, now)
	}
	if err := template.ValidateGeneration(req.Generation); err != nil {
		return err
	}
	_, err = s.templates.Generation(req.Template, req.Generation, now)
	switch errcode.Of(err) {
	case errcode.TemplateNotFound, errcode.GenerationNotFound:
	default:
		return nil // held here (whatever its state, the clone judges it), or an error the clone meets too
	}
	return s.pull(ctx, req.Template, req.Generation)
}

// pullCurrent serves a clone that names a template and no generation. Such a clone takes
// the template's current generation, the newest, and in a cluster that is the registry's
// (the template was captured on one node, perhaps another): so the node asks the registry
// for it (a listing of its tags) and pulls it when it is newer than every generation held
// here. A node that holds the template goes on when the registry cannot answer or the pull
// fails (the clone takes the newest generation held here, logged); one that holds none of it
// answers the registry's error (registry-unavailable, template-not-found).
func (s *Supervisor) pullCurrent(ctx context.Context, tmpl string, now template.TimeContract) error {
	gens, err := s.templates.Generations(tmpl, now)
	if err != nil && errcode.Of(err) != errcode.TemplateNotFound {
		return nil // an error the clone meets too
	}
	newest := ""
	for _, g := range gens {
		if template.NewerGeneration(g.ID, newest) {
			newest = g.ID
		}
	}
	cur, err := s.generations.Current(ctx, tmpl)
	if err == nil {
		if !template.NewerGeneration(cur, newest) {
			return nil
		}
		err = s.pull(ctx, tmpl, cur)
	}
	if err == nil || len(gens) == 0 {
		return err
	}
	s.log.Warn("the template registry's current generation could not be brought here; the clone takes the newest generation this node holds", "template", tmpl, "held", newest, "current", cur, "err", err)
	return nil
}

// pull brings generation gen of tmpl here from the registry; one held here already is done.
func (s *Supervisor) pull(ctx context.Context, tmpl, gen string) error {
	start := time.Now()
	err := s.generations.Pull(ctx, tmpl, gen)
	if errcode.Of(err) == errcode.TemplateExists {
		return nil
	}
	if err != nil {
		return err
	}
	s.log.Info("pulled a generation from the template registry", "template", tmpl, "generation", gen, "duration", time.Since(start))
	return nil
}

// changesUnderWay counts, by "<template>/<generation>", the tombstones and retirements of
// this process between their outbox record and their end: until the change is made (or
// refused) the record says nothing, and a flush that judged it then would drop it as a
// change never made.
type changesUnderWay struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *changesUnderWay) add(tmpl string, gens []string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	for _, gen := range gens {
		k := tmpl + "/" + gen
		if c.m[k] += d; c.m[k] <= 0 {
			delete(c.m, k)
		}
	}
}

// busy says whether a change of the generation is under way in this process.
func (c *changesUnderWay) busy(tmpl, gen string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[tmpl+"/"+gen] > 0
}

// recordRemote records in the template store's outbox, before a tombstone or retirement is
// made here, that the registry is to record it for the other nodes (flushRemote pushes it):
// so a crash, or a registry that is down, between the change here and its push leaves the
// record, which bothyd's start-up and periodic sweep (SyncTombstones) and `bothyd check
// --repair` push. Without a registry there is nothing to record. A record that cannot be
// written refuses the change, as any other write of the template store would.
func (s *Supervisor) recordRemote(ctx context.Context, tmpl string, gens []string, retire bool) error {
	if s.generations == nil || s.templates == nil {
		return nil
	}
	s.changing.add(tmpl, gens, 1)
	for _, gen := range gens {
		if err := s.templates.RecordRemoteTombstone(ctx, tmpl, gen, retire); err != nil {
			s.changing.add(tmpl, gens, -1)
			return err
		}
	}
	return nil
}

// settleRemote follows a tombstone or retirement that recordRemote announced. A change
// refused with a caller's error (not found, leased, invalid) changed nothing here, and its
// records go: this node has nothing to tell the registry. After a change made, or one that
// a storage fault or a crash may have left half made, the outbox is pushed in the
// background (flushRemote), which drops the records of a change that was not made (its
// generation still active here) and pushes the others.
func (s *Supervisor) settleRemote(ctx context.Context, tmpl string, gens []string, retire bool, err error) {
	if s.generations == nil || s.templates == nil || len(gens) == 0 {
		return
	}
	defer s.changing.add(tmpl, gens, -1)
	switch errcode.Of(err) {
	case "", errcode.Internal, errcode.StorageFull, errcode.StorageUnavailable:
	default:
		ctx := context.WithoutCancel(ctx)
		for _, gen := range gens {
			derr := s.templates.RemoteTombstoneDone(ctx, tmpl, gen, retire)
			// A retirement refused (leased) of a generation tombstoned here before may
			// have replaced the record of that tombstone, not yet pushed: it is recorded
			// again (a tombstone pushed twice is one tombstone).
			if derr == nil && retire && s.quarantinedHere(tmpl, gen) {
				derr = s.templates.RecordRemoteTombstone(ctx, tmpl, gen, false)
			}
			if derr != nil {
				s.log.Warn("removing the outbox record of a tombstone that was not made; the next sweep drops it", "template", tmpl, "generation", gen, "err", derr)
			}
		}
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(s.life, time.Minute)
		defer cancel()
		s.flushRemote(ctx)
	}()
}

// quarantinedHere says whether this node holds the generation tombstoned or retiring.
func (s *Supervisor) quarantinedHere(tmpl, gen string) bool {
	now, err := s.templates.Now()
	if err != nil {
		return false
	}
	g, err := s.templates.Generation(tmpl, gen, now)
	return err == nil && g.State != template.StateActive
}

// flushRemote pushes the template store's outbox to the registry (GenerationRegistry.
// FlushTombstones) and lets go of this node's mark on each generation it pushed: the copy
// here may be gone already (a retirement without leases), and the registry's copy may go
// now. One that fails is logged and stays in the outbox for the next sweep.
func (s *Supervisor) flushRemote(ctx context.Context) {
	if s.generations == nil || s.templates == nil {
		return
	}
	if recs, err := s.templates.RemoteTombstones(); err == nil && len(recs) > 0 {
		// A crash here leaves the change made on this node and not in the registry: the
		// outbox's record is pushed at the next start (SyncTombstones).
		s.crash("registry-tombstone")
	}
	pushed, err := s.generations.FlushTombstones(ctx, s.changing.busy)
	for _, p := range pushed {
		s.log.Info("recorded a tombstone in the template registry", "template", p.Template, "generation", p.Generation, "retire", p.Retire)
		s.releaseOne(ctx, p.Template, p.Generation)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Warn("recording a tombstone in the template registry; other nodes keep cloning the generation until a later sweep records it", "err", err)
	}
}

// releaseRemote tells the registry, in the background, that this node's copies of gens
// are gone (retired here): its marks go, and the registry's copy of each goes once no
// node's mark is left.
func (s *Supervisor) releaseRemote(tmpl string, gens ...string) {
	if s.generations == nil || len(gens) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(s.life, time.Minute)
		defer cancel()
		for _, gen := range gens {
			s.releaseOne(ctx, tmpl, gen)
		}
	}()
}

// releaseOne is Release of one generation, logged: a registry that is down or refuses
// DELETE leaves the mark or the copy in the registry, which bothyd's periodic sweep
// (registry.Collect) tries again; no clone depends on it.
func (s *Supervisor) releaseOne(ctx context.Context, tmpl, gen string) {
	// A crash here leaves this node's mark on a copy that is gone: the sweep at the next
	// start removes it (registry.Collect).
	s.crash("registry-release")
	if err := s.generations.Release(ctx, tmpl, gen); err != nil {
		s.log.Warn("letting go of a generation in the template registry; its copy stays there until a later sweep deletes it", "template", tmpl, "generation", gen, "err", err)
	}
}

// SyncTombstones applies the registry's tombstones to this node: every generation it holds
// that the cluster retired is retired here with drain (no new clone; the last clone's
// release deletes it), and every one the cluster tombstoned is tombstoned. bothyd calls it
// at start-up and periodically. Generations without a tombstone, and a registry that cannot
// be reached, change nothing.
func (s *Supervisor) SyncTombstones(ctx context.Context) error {
	if s.generations == nil || s.templates == nil {
		return nil
	}
	// First what this node made and has not yet told the registry (a crash, a registry
	// that was down).
	s.flushRemote(ctx)
	now, err := s.templates.Now()
	if err != nil {
		return err
	}
	tmpls, err := s.templates.Templates(now)
	if err != nil {
		return err
	}
	for _, t := range tmpls {
		gens, err := s.templates.Generations(t.Name, now)
		if err != nil {
			continue // deleted meanwhile
		}
		for _, g := range gens {
			if g.State == template.StateRetiring {
				continue
			}
			found, retire, err := s.generations.Tombstoned(ctx, t.Name, g.ID)
			if err != nil {
				return err
			}
			switch {
			case found && retire:
				_, err = s.retireLocal(ctx, t.Name, g.ID)
			case found && g.State == template.StateActive:
				_, err = s.tombstoneLocal(ctx, t.Name, g.ID)
			default:
				continue
			}
			if err != nil {
				s.log.Warn("applying the template registry's tombstone", "template", t.Name, "generation", g.ID, "retire", retire, "err", err)
				continue
			}
			s.log.Info("applied the template registry's tombstone", "template", t.Name, "generation", g.ID, "retire", retire)
		}
	}
	return nil
}
