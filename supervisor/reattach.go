package supervisor

import (
	"context"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

func mismatchError(id string) error {
	return errcode.New(errcode.RuntimeMismatch,
		"Sandbox %s runs under another bothyd build or runtime configuration; this server will not drive it. Stop it with force=true, or use the bothyd that started it.", id)
}

// reconciled is what reattach found. A live launch is StateRunning with its runtime record;
// mismatch says that another runtime identity runs it, which callers refuse to drive (all but
// a forced stop) while it still counts as running: it cannot be deleted or captured.
type reconciled struct {
	state    State
	rec      *store.RuntimeRecord // the live launch's, for StateRunning
	mismatch bool
	// paused says the live launch is paused (its pause record names it, and its processes
	// are frozen).
	paused bool
}

// drivable reports a live launch that this server may drive.
func (r reconciled) drivable() bool { return r.state == StateRunning && !r.mismatch }

// reattach reconciles a locked sandbox's records with its processes (see the package doc) and
// returns what it found: StateRunning (with the live launch's runtime record, so that callers
// need not read it again, and whether another runtime identity runs it), StateStopped or
// StateProvisioned.
func (s *Supervisor) reattach(ctx context.Context, l *store.Lock) (reconciled, error) {
	if err := s.recoverCheckpoints(l, false); err != nil {
		return reconciled{}, err
	}
	journal, err := l.LaunchJournal()
	if err != nil {
		return reconciled{}, err
	}
	rec, err := l.RuntimeRecord()
	if err != nil {
		return reconciled{}, err
	}
	if journal != nil {
		if rec != nil && rec.LaunchID == journal.LaunchID {
			// The launch committed; only the journal's removal was interrupted.
			if err := l.RemoveLaunchJournal(); err != nil {
				return reconciled{}, err
			}
		} else {
			s.log.Warn("ending an interrupted start", "sandbox", l.ID(), "launch", journal.LaunchID, "pid", journal.Pid)
			proc := journalProcess(journal)
			if err := s.endLaunch(ctx, l, proc); err != nil {
				return reconciled{}, err
			}
			_ = runtime.WriteOutcome(l.Dir(), &runtime.Outcome{
				Format: runtime.OutcomeFormat, LaunchID: journal.LaunchID, Reason: runtime.ReasonStartFailed,
				ExitCode: -1, At: time.Now().UTC(),
			})
			if err := l.RemoveLaunchJournal(); err != nil {
				return reconciled{}, err
			}
		}
	}
	if rec == nil {
		s.dropClient(l.ID())
		if _, err := s.reconcilePause(ctx, l, nil, false); err != nil {
			return reconciled{}, err
		}
		state, err := s.restingState(l)
		return reconciled{state: state}, err
	}
	proc := processOf(rec)
	if proc.Alive() {
		// A report naming this launch means the sandbox has ended and its runtime process
		// is finishing up: wait for it (briefly), so that a sandbox never reads as stopped
		// to Status and as running to a transition.
		if o, err := l.Outcome(); err == nil && o != nil && o.LaunchID == rec.LaunchID {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = platform.WaitExit(wctx, proc)
			cancel()
		}
	}
	if proc.Alive() {
		if s.mismatched(rec) {
			return reconciled{state: StateRunning, rec: rec, mismatch: true}, nil
		}
		s.adoptNetwork(l, rec)
		s.watch(l.ID(), rec)
		paused, err := s.reconcilePause(ctx, l, rec, false)
		if err != nil {
			return reconciled{}, err
		}
		return reconciled{state: StateRunning, rec: rec, paused: paused}, nil
	}
	// The runtime process is gone: the sandbox ended while nobody held the lock. The outcome
	// report (if the runtime process wrote one) says how.
	s.log.Info("sandbox ended", "sandbox", l.ID(), "launch", rec.LaunchID)
	s.dropClient(l.ID())
	// Thaw first: the cleanup kills what is left in the sandbox's cgroup, and a frozen
	// process (on cgroup v1) does not die.
	if _, err := s.reconcilePause(ctx, l, nil, false); err != nil {
		return reconciled{}, err
	}
	rt, err := s.runtimeOfRecord(rec)
	if err != nil {
		return reconciled{}, err
	}
	if err := rt.Cleanup(ctx, l.ID(), l.Dir(), proc); err != nil {
		return reconciled{}, err
	}
	s.detachNetwork(l.ID())
	if err := l.CleanStaging(); err != nil {
		return reconciled{}, err
	}
	if err := l.RemoveRuntimeRecord(); err != nil {
		return reconciled{}, err
	}
	return reconciled{state: StateStopped}, nil
}

func (s *Supervisor) restingState(l *store.Lock) (State, error) {
	o, err := l.Outcome()
	if err != nil {
		return "", err
	}
	if o != nil {
		return StateStopped, nil
	}
	return StateProvisioned, nil
}

func journalProcess(j *store.LaunchJournal) (p platform.ProcessID) {
	if j.Pid == 0 {
		return p
	}
	p.Pid, p.StartTime, p.BootID = j.Pid, j.PidStartTime, j.BootID
	return p
}

// ReattachAll reconciles every sandbox of the state root, as bothyd does at start-up:
// interrupted starts are ended, stale records cleared, running sandboxes kept. It is
// [Supervisor.StartReattach] and a wait for its pass to end.
func (s *Supervisor) ReattachAll(ctx context.Context, timeout time.Duration) error {
	if err := s.StartReattach(ctx, timeout); err != nil {
		return err
	}
	select {
	case <-s.reconciled:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// StartReattach lists the sandboxes of the state root and reconciles them in the background,
// so that bothyd serves at once after a restart however many sandboxes it has (issue 17:
// 4000 took seconds one after the other). Until the pass has reached a sandbox, the first
// operation that locks it ([Supervisor.lockProvisioned]) reconciles it first, exactly as the
// pass would: nothing is ever driven unreconciled. A status read meanwhile settles its
// sandbox the same way ([Supervisor.settleAtStartup]), so that nothing reads as a crash left
// it (an interrupted start as "starting"); once the pass is done, reads take no lock, as
// always. What only the pass does for
// every sandbox at once comes later by up to the pass's length: exits that happened while
// bothyd was down are noticed (and their events sent) and lifetimes re-armed as the pass
// reaches each, and networks whose sandbox no longer runs are torn down at its end. A sandbox
// whose lock another process holds past timeout is skipped and reported. The trash's janitor
// starts with the first pass, and empties what a crash left there first.
func (s *Supervisor) StartReattach(ctx context.Context, timeout time.Duration) error {
	s.janitor.Do(func() {
		s.wg.Add(1)
		go s.emptyTrash()
	})
	t0 := time.Now()
	ids, err := s.store.List()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	s.mu.Lock()
	s.unreconciled = make(map[string]bool, len(ids))
	for _, id := range ids {
		s.unreconciled[id] = true
	}
	s.reconciled = done
	s.mu.Unlock()
	// The pass ends with the supervisor too (Close waits for it).
	pctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.life, cancel)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		defer stop()
		defer cancel()
		s.reattachPass(pctx, ids, timeout)
		s.log.Info("reattached sandboxes", "sandboxes", len(ids), "took", time.Since(t0).Round(time.Millisecond))
	}()
	return nil
}

// reattachPass reconciles each of ids that no operation has reconciled meanwhile, then the
// networks.
func (s *Supervisor) reattachPass(ctx context.Context, ids []string, timeout time.Duration) {
	for _, id := range ids {
		if ctx.Err() != nil {
			return
		}
		if !s.isUnreconciled(id) {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, timeout)
		l, err := s.store.LockExisting(lctx, id)
		if err != nil {
			cancel()
			s.takeUnreconciled(id)
			if errcode.Of(err) != errcode.SandboxNotFound {
				s.log.Warn("reattach: cannot lock sandbox", "sandbox", id, "err", err)
			}
			continue
		}
		// Taken under the lock: an operation that locked it first has reconciled it.
		if s.takeUnreconciled(id) {
			l = s.reconcileAtStartup(lctx, l)
		}
		if l != nil {
			s.unlock(l)
		}
		cancel()
	}
	s.reconcileNetworks(ctx, timeout)
	s.sweepUnboundLeases(ctx, timeout)
}

// reconcileAtStartup reconciles the sandbox that l locks for the first time since start-up
// and returns the lock, or nil if the sandbox is gone: a create with start that crashed before
// its start committed is all or nothing, so it is removed.
func (s *Supervisor) reconcileAtStartup(ctx context.Context, l *store.Lock) *store.Lock {
	id := l.ID()
	cfg, err := l.Config()
	if err == nil && cfg != nil {
		var r reconciled
		if err = s.recoverCheckpoints(l, true); err == nil {
			r, err = s.reattach(ctx, l)
		}
		if r.drivable() {
			_, err = s.reconcilePause(ctx, l, r.rec, true)
		}
		if r.mismatch {
			s.log.Warn("reattach: sandbox runs under another runtime identity", "sandbox", id)
		}
		if err == nil && hasPending(l.Dir()) {
			if r.state == StateRunning {
				err = removePending(l.Dir())
			} else {
				s.log.Warn("reattach: removing a sandbox whose create did not finish", "sandbox", id)
				err = s.deprovisionLocked(ctx, l)
				l = nil
			}
		}
	}
	if err != nil {
		s.log.Error("reattach failed", "sandbox", id, "err", err)
	}
	if l != nil {
		s.armLifetime(id)
	}
	return l
}

// takeUnreconciled reports whether sandbox id awaits its start-up reconciliation, and takes
// that task: the caller, holding its lock, does it.
func (s *Supervisor) takeUnreconciled(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.unreconciled[id] {
		return false
	}
	delete(s.unreconciled, id)
	return true
}

func (s *Supervisor) isUnreconciled(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unreconciled[id]
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
