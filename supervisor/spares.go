package supervisor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/store"
)

// Spares are sandboxes started ahead, with the server's defaults, for creates that have not
// come yet (issue 17: a start costs about four bare bwrap spawns, and no part of it is cheap).
// A create with start that leaves the id, and everything that shapes a start, to the server
// claims one: it gets a running sandbox for the price of one durable write. A create that
// names an id, an image, limits, an environment, a network or a template starts one of its
// own, as before.
//
// A spare is an ordinary sandbox of the store whose configuration record carries
// [store.Config.Spare]: recorded before it is made (the mark is in the first record written),
// started under the crash protocol of any create with start, reconciled by reattach, read by
// bothyd check. The mark keeps it out of listings, lookups and every by-id operation, so no
// client can see or drive it; its events are not published. A claim is the rewrite of that
// record without the mark (and with the create's labels and lifetime): before the rewrite the
// sandbox is a spare, after it the client's, and a crash between leaves one or the other.
//
// The supervisor keeps SpareOptions.Count of them, making one at a time in the background
// after each claim. At start-up, after the reattach pass, the spares that still run, match
// the profile and are not more than Count are kept; the others are stopped and deleted. A
// graceful Close deletes this process's spares, so that a stopped server leaves none
// running; a crash leaves them to the next start-up.

// SpareOptions configure the spares.
type SpareOptions struct {
	// Count is how many started spares the supervisor keeps ready; 0 keeps none (and deletes
	// the spares an earlier run left).
	Count int
	// Resources and DiskMB are the defaults the server gives a create that names none: a
	// spare is made with them, and only a create that asks for exactly them claims one.
	Resources Resources
	DiskMB    int
}

// spareBackoff bounds the wait after a spare could not be made, so that a host that cannot
// start sandboxes (a full disk, an exhausted id range) is not hammered by the refill.
const (
	spareBackoffMin = time.Second
	spareBackoffMax = time.Minute
)

// spareCreateTimeout bounds the making or the deleting of one spare, as a client's request is
// bounded.
const spareCreateTimeout = time.Minute

// spareSet is what this process knows of its spares.
type spareSet struct {
	opts SpareOptions
	// managed says the supervisor keeps spares (Options.Spares was set).
	managed bool

	mu sync.Mutex
	// ready are the started spares, the oldest first.
	ready []string
	// known are every spare this process made, is making, keeps or is deleting: their events
	// are not published.
	known map[string]bool
	// scanned says the start-up scan has marked the spares an earlier run left in known;
	// until then an event's sandbox is looked up on disk.
	scanned bool
	// wake tells the refill that a spare was claimed or discarded.
	wake chan struct{}
	// stop ends the refill (Close), done is closed when it has ended.
	stop context.CancelFunc
	done chan struct{}
	// claimed and missed count the creates the spares serve that got one, and that found
	// none ready (or none that could still be claimed).
	claimed, missed uint64
}

// SpareStats is what [Supervisor.SpareStats] reports.
type SpareStats struct {
	// Wanted is how many spares the supervisor keeps; Ready how many are ready now.
	Wanted, Ready int
	// Claimed counts the creates given a spare since start-up; Missed those the spares
	// serve that found none ready, and started a sandbox of their own. Many misses say the
	// count is too small for the rate of creates.
	Claimed, Missed uint64
}

// SpareStats reports the spares' count, and how creates fared with them.
func (s *Supervisor) SpareStats() SpareStats {
	sp := s.spares
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return SpareStats{Wanted: sp.opts.Count, Ready: len(sp.ready), Claimed: sp.claimed, Missed: sp.missed}
}

// count records how a create the spares serve fared.
func (sp *spareSet) count(claimed bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if claimed {
		sp.claimed++
	} else {
		sp.missed++
	}
}

// newSpareSet is the spare set of opts; nil keeps none and never looks for any.
func newSpareSet(opts *SpareOptions) *spareSet {
	sp := &spareSet{known: map[string]bool{}, wake: make(chan struct{}, 1), scanned: true}
	if opts != nil {
		// Until the start-up scan, an event's sandbox may be a spare an earlier run left.
		sp.opts, sp.managed, sp.scanned = *opts, true, false
	}
	return sp
}

// NewSandboxID makes an id for a sandbox whose create names none: "sb-" and 12 characters of
// a-z 0-9 (62 bits), unlikely to collide and refused by the store if it does.
func NewSandboxID() string { return "sb-" + naming.RandomAlnum(12) }

// serves reports whether a create of req may be given a spare: a start with the server's
// id and the spares' profile, differing at most in labels and lifetime, which a claim
// records.
func (sp *spareSet) serves(req CreateRequest) bool {
	image := req.Image
	if image == "" {
		image = HostImage
	}
	return sp.opts.Count > 0 && req.AnyID && req.Start && req.Clone == nil && req.Sleep == nil && len(req.Volumes) == 0 &&
		sp.matches(&store.Config{Image: image, Runtime: req.Runtime, Resources: req.Resources,
			DiskMB: req.DiskMB, Env: req.Env, Network: req.Network})
}

// matches reports whether a spare's configuration is the profile's (a restart may have
// changed the defaults).
func (sp *spareSet) matches(cfg *store.Config) bool {
	return cfg.Image == HostImage && cfg.Runtime == "" && cfg.Resources == sp.opts.Resources &&
		cfg.DiskMB == sp.opts.DiskMB && len(cfg.Env) == 0 && cfg.Network == nil && cfg.Template == nil
}

// take removes the oldest ready spare and tells the refill.
func (sp *spareSet) take() (string, bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if len(sp.ready) == 0 {
		return "", false
	}
	id := sp.ready[0]
	sp.ready = slices.Delete(sp.ready, 0, 1)
	sp.nudge()
	return id, true
}

// nudge wakes the refill; sp.mu is held or not needed.
func (sp *spareSet) nudge() {
	select {
	case sp.wake <- struct{}{}:
	default:
	}
}

// forget drops id from known: it is a client's, or gone.
func (sp *spareSet) forget(id string) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	delete(sp.known, id)
}

// hidesEvent reports whether an event of sandbox id is a spare's, which no client hears of.
func (s *Supervisor) hidesEvent(id string) bool {
	if id == "" {
		return false
	}
	sp := s.spares
	sp.mu.Lock()
	known, scanned := sp.known[id], sp.scanned
	sp.mu.Unlock()
	if known || scanned {
		return known
	}
	cfg, err := s.store.ReadConfigUnlocked(id)
	return err == nil && cfg.Spare
}

// errSpareGone says a ready spare could not be claimed: it no longer runs as it was made.
var errSpareGone = errors.New("the spare no longer runs as it was made")

// claimSpare gives a create of req a ready spare, if the spares serve it and one can be
// claimed, or returns nil: the create then makes a sandbox of its own. A spare that cannot be
// claimed is deleted in the background and the next one tried.
func (s *Supervisor) claimSpare(ctx context.Context, req CreateRequest) *Status {
	if !s.spares.serves(req) {
		return nil
	}
	for {
		id, ok := s.spares.take()
		if !ok {
			s.spares.count(false)
			return nil
		}
		st, err := s.claim(ctx, id, req)
		if err == nil {
			s.spares.count(true)
			return st
		}
		s.log.Warn("a spare could not be claimed; discarding it", "spare", id, "err", err)
		s.discardLater(id)
		if ctx.Err() != nil {
			s.spares.count(false)
			return nil
		}
	}
}

// claim makes spare id the sandbox of a create of req, under its lock.
func (s *Supervisor) claim(ctx context.Context, id string, req CreateRequest) (_ *Status, err error) {
	defer s.observe("provision", time.Now(), &err)
	l, err := s.store.LockExisting(ctx, id)
	if err != nil {
		return nil, err
	}
	defer func() {
		if l != nil {
			s.unlock(l)
		}
	}()
	cfg, err := l.Config()
	if err != nil {
		return nil, err
	}
	if !cfg.Spare {
		return nil, fmt.Errorf("sandbox %s is no spare", id)
	}
	r, err := s.reattach(ctx, l)
	if err != nil {
		return nil, err
	}
	if !r.drivable() || r.paused {
		return nil, errSpareGone
	}
	// The lifetime first: a crash after it leaves a spare with a deadline, which the next
	// start-up discards; the other order could leave a claimed sandbox without its lifetime.
	now := time.Now()
	if req.Lifetime != nil {
		if err := writeDeadline(l.Dir(), newDeadline(*req.Lifetime, now)); err != nil {
			return nil, err
		}
	}
	claimed := *cfg
	claimed.Spare = false
	claimed.Labels = req.Labels
	claimed.CreatedAt = now.UTC()
	if err := l.WriteConfig(&claimed); err != nil {
		return nil, err
	}
	s.unlock(l)
	l = nil
	s.spares.forget(id)
	s.armLifetime(id)
	s.emit(Event{Type: EventCreated, Sandbox: id, State: StateProvisioned})
	s.emit(Event{Type: EventStarted, Sandbox: id, State: StateRunning})
	return s.Status(id)
}

// StartSpares starts keeping the spares of Options.Spares, once the start-up reattach pass
// has ended: it keeps the spares an earlier run left that still run and match, deletes the
// others, and then refills after each claim. It is called once, after
// [Supervisor.StartReattach]; without Options.Spares it does nothing.
func (s *Supervisor) StartSpares() {
	s.mu.Lock()
	closed, reconciled := s.closed, s.reconciled
	s.mu.Unlock()
	sp := s.spares
	sp.mu.Lock()
	if closed || sp.stop != nil || !sp.managed {
		sp.mu.Unlock()
		return
	}
	ctx, stop := context.WithCancel(s.life)
	done := make(chan struct{})
	sp.stop, sp.done = stop, done
	sp.mu.Unlock()
	go func() {
		defer close(done)
		select {
		case <-reconciled:
		case <-ctx.Done():
			return
		}
		s.adoptSpares(ctx)
		s.refillSpares(ctx)
	}()
}

// adoptSpares marks the spares that an earlier run left, keeps those that can still be
// claimed (up to Count) and deletes the rest.
func (s *Supervisor) adoptSpares(ctx context.Context) {
	sp := s.spares
	ids, err := s.store.List()
	if err != nil {
		s.log.Warn("listing sandboxes for the spares an earlier run left", "err", err)
	}
	var found []string
	kept := 0
	sp.mu.Lock()
	for _, id := range ids {
		if cfg, err := s.store.ReadConfigUnlocked(id); err == nil && cfg.Spare {
			sp.known[id] = true
			found = append(found, id)
		}
	}
	sp.scanned = true
	sp.mu.Unlock()
	for _, id := range found {
		if ctx.Err() != nil {
			return
		}
		keep := s.claimable(id)
		sp.mu.Lock()
		if keep = keep && len(sp.ready) < sp.opts.Count; keep {
			sp.ready = append(sp.ready, id)
			kept++
		}
		sp.mu.Unlock()
		if !keep {
			s.discard(ctx, id)
		}
	}
	if len(found) > 0 {
		s.log.Info("spares an earlier run left", "found", len(found), "kept", kept)
	}
}

// claimable reports whether spare id runs, under this server's runtime, as the profile says
// and untouched by a claim.
func (s *Supervisor) claimable(id string) bool {
	st, err := s.status(id, true)
	if err != nil || st.State != StateRunning || st.RuntimeMismatch || st.ExpiresAt != nil {
		return false
	}
	return s.spares.matches(&st.Config)
}

// refillSpares makes spares, one at a time, whenever fewer than Count are ready, until ctx
// ends. A default runtime that cannot take sandboxes on this host (a kernel without a
// feature they need, found at start-up) makes none: its refusal is final, and each retry
// would only log it again.
func (s *Supervisor) refillSpares(ctx context.Context) {
	sp := s.spares
	if s.runtimes.unavailable[s.rt.Kind()] != nil {
		s.log.Warn("no spares are made: the default runtime takes no sandboxes here", "runtime", s.rt.Kind(), "reason", s.runtimes.unavailable[s.rt.Kind()])
		return
	}
	backoff := spareBackoffMin
	for {
		sp.mu.Lock()
		short := len(sp.ready) < sp.opts.Count
		sp.mu.Unlock()
		if !short {
			select {
			case <-sp.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		if err := s.makeSpare(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("a spare could not be made; trying again later", "in", backoff, "err", err)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, spareBackoffMax)
			continue
		}
		backoff = spareBackoffMin
	}
}

// makeSpare creates and starts one spare.
func (s *Supervisor) makeSpare(ctx context.Context) error {
	sp := s.spares
	id := NewSandboxID()
	sp.mu.Lock()
	sp.known[id] = true
	sp.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, spareCreateTimeout)
	defer cancel()
	_, err := s.Create(cctx, CreateRequest{ID: id, Resources: sp.opts.Resources, DiskMB: sp.opts.DiskMB, Start: true, spare: true})
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if err != nil {
		delete(sp.known, id) // a create that fails removes what it made
		return err
	}
	sp.ready = append(sp.ready, id)
	return nil
}

// spareExited replaces spare id, whose runtime process exited (a kill, the host's OOM killer):
// it is no longer ready, it is deleted, and the refill makes another.
func (s *Supervisor) spareExited(id string) {
	sp := s.spares
	sp.mu.Lock()
	sp.ready = slices.DeleteFunc(sp.ready, func(r string) bool { return r == id })
	sp.mu.Unlock()
	s.discardLater(id)
	sp.nudge()
}

// discardLater deletes spare id in the background (a claim must not wait for it).
func (s *Supervisor) discardLater(id string) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := cleanupContext(s.life)
		defer cancel()
		s.discard(ctx, id)
	}()
}

// discard stops and deletes spare id; one that cannot be is left to the next start-up.
func (s *Supervisor) discard(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, spareCreateTimeout)
	defer cancel()
	l, _, err := s.lockAnyProvisioned(ctx, id)
	if err == nil {
		if cfg, cerr := l.Config(); cerr != nil || !cfg.Spare {
			s.unlock(l) // claimed meanwhile: a client's now
			return
		}
		err = s.deleteLocked(ctx, l, true)
	}
	if err != nil && errcode.Of(err) != errcode.SandboxNotFound {
		s.log.Warn("deleting a spare; the next start-up tries again", "spare", id, "err", err)
		return
	}
	s.spares.forget(id)
}

// closeSpares ends the refill and deletes this process's spares, so that a server that
// stops leaves none running (Close).
func (s *Supervisor) closeSpares() {
	sp := s.spares
	sp.mu.Lock()
	stop, done := sp.stop, sp.done
	sp.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-done
	sp.mu.Lock()
	ids := slices.Sorted(maps.Keys(sp.known))
	sp.ready = nil
	sp.mu.Unlock()
	ctx, cancel := cleanupContext(context.Background())
	defer cancel()
	for _, id := range ids {
		s.discard(ctx, id)
	}
}
