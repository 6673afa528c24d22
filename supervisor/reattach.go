package supervisor

import (
	"context"
	"time"

	"github.com/sandboxd/sandboxd/errcode"
	"github.com/sandboxd/sandboxd/platform"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
)

func mismatchError(id string) error {
	return errcode.New(errcode.RuntimeMismatch,
		"Sandbox %s runs under another sandboxd build or runtime configuration; this server will not drive it. Stop it with force=true, or use the sandboxd that started it.", id)
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

// ReattachAll reconciles every sandbox of the state root, as sandboxd does at start-up
// before it serves: interrupted starts are ended, stale records cleared, running sandboxes
// kept. A sandbox whose lock another process holds past timeout is skipped and reported.
func (s *Supervisor) ReattachAll(ctx context.Context, timeout time.Duration) error {
	ids, err := s.store.List()
	if err != nil {
		return err
	}
	running := 0
	for _, id := range ids {
		lctx, cancel := context.WithTimeout(ctx, timeout)
		l, err := s.store.LockExisting(lctx, id)
		if err != nil {
			cancel()
			if errcode.Of(err) != errcode.SandboxNotFound {
				s.log.Warn("reattach: cannot lock sandbox", "sandbox", id, "err", err)
			}
			continue
		}
		cfg, err := l.Config()
		if err == nil && cfg != nil {
			var r reconciled
			r, err = s.reattach(lctx, l)
			if r.drivable() {
				running++
				_, err = s.reconcilePause(lctx, l, r.rec, true)
			}
			if r.mismatch {
				s.log.Warn("reattach: sandbox runs under another runtime identity", "sandbox", id)
			}
			if err == nil && hasPending(l.Dir()) {
				if r.state == StateRunning {
					err = removePending(l.Dir())
				} else {
					// A create with start that crashed before its start committed: it is
					// all or nothing, so it is nothing.
					s.log.Warn("reattach: removing a sandbox whose create did not finish", "sandbox", id)
					err = s.deprovisionLocked(lctx, l)
					l = nil
				}
			}
		}
		if err != nil {
			s.log.Error("reattach failed", "sandbox", id, "err", err)
		}
		if l != nil {
			s.unlock(l)
			s.armLifetime(id)
		}
		cancel()
	}
	s.reconcileNetworks(ctx, timeout)
	s.sweepUnboundLeases(ctx, timeout)
	s.log.Info("reattached sandboxes", "sandboxes", len(ids), "running", running)
	return nil
}
