package supervisor

import (
	"context"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/image"
)

// Stop ends a running sandbox: gracefully through its agent (TERM every process, wait a
// grace period, KILL the rest), or, with force, by killing its init by verified identity. A
// graceful stop that does not finish by ctx's deadline reports stop-timeout and leaves the
// sandbox running.
func (s *Supervisor) Stop(ctx context.Context, id string, force bool) (_ *Status, err error) {
	defer s.observe("stop", time.Now(), &err)
	l, _, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(l)
	r, err := s.reattach(ctx, l)
	if err != nil {
		return nil, err
	}
	switch {
	case r.mismatch && !force:
		return nil, mismatchError(id)
	case r.state != StateRunning: // under any runtime identity
		return nil, errcode.New(errcode.NotRunning, "Sandbox %s is not running.", id)
	}
	o, err := s.stopLocked(ctx, l, r.rec, force)
	if err != nil {
		return nil, err
	}
	s.emit(Event{Type: EventStopped, Sandbox: id, State: StateStopped, Exit: o})
	return s.Status(id)
}

// stopLocked ends the live launch rec of the sandbox locked by l (see [Supervisor.Stop]) and
// clears its records; it returns the outcome report of the launch, nil if there is none. A
// paused sandbox is thawed first: a frozen process cannot act on TERM, and on cgroup v1 not
// even on KILL.
func (s *Supervisor) stopLocked(ctx context.Context, l *store.Lock, rec *store.RuntimeRecord, force bool) (*Exit, error) {
	id := l.ID()
	proc := processOf(rec)
	s.setTransient(id, StateStopping)
	defer s.setTransient(id, "")
	rt, err := s.runtimeOfRecord(rec)
	if err != nil {
		return nil, err
	}
	released, err := s.thawForStop(ctx, l)
	if err != nil {
		return nil, err
	}
	if force || released {
		if err := rt.Kill(ctx, l.Dir(), proc); err != nil {
			return nil, err
		}
	} else if err := s.shutdown(ctx, l, rec); err != nil {
		return nil, err
	}
	s.dropClient(id)
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := rt.Cleanup(cctx, id, l.Dir(), proc); err != nil {
		return nil, err
	}
	s.detachNetwork(id)
	if err := l.CleanStaging(); err != nil {
		return nil, err
	}
	// The runtime process reported how the sandbox ended; that it ended on request is ours
	// to add. Nothing else writes the report now: its writer has exited. The amendment is
	// not synced on its own: the runtime record's removal, next, syncs the directory, and
	// until then a crash of the host leaves the runtime process's report, which is true.
	o, oerr := l.Outcome()
	if oerr == nil && o != nil && o.LaunchID == rec.LaunchID {
		o.Reason = runtime.ReasonStopped
		if force {
			o.Reason = ReasonKilled
		}
		_ = runtime.AmendOutcome(l.Dir(), o)
	}
	if err := l.RemoveRuntimeRecord(); err != nil {
		return nil, err
	}
	s.setTransient(id, "")
	return o, nil
}

// shutdown asks the agent to end the sandbox and waits for the runtime process to exit.
func (s *Supervisor) shutdown(ctx context.Context, l *store.Lock, rec *store.RuntimeRecord) error {
	grace := s.grace
	if d, ok := ctx.Deadline(); ok {
		// Leave half of the time for the KILL and the exit to be seen.
		grace = min(grace, time.Until(d)/2)
	}
	proc := processOf(rec)
	client, err := s.agent(ctx, l.Dir(), l.ID(), rec)
	if err == nil {
		err = client.Shutdown(ctx, grace)
	}
	if err != nil {
		// An agent that died (or went away) under the request has ended the sandbox, or is
		// ending it: what matters is whether the runtime process exits in time.
		s.log.Debug("asking the agent to shut down", "sandbox", l.ID(), "err", err)
	}
	if err := platform.WaitExit(ctx, proc); err != nil {
		return errcode.Wrap(errcode.StopTimeout, err,
			"Sandbox %s did not stop in time and is still running; retry with a longer timeout, or with force=true.", l.ID())
	}
	return nil
}

// Deprovision removes a sandbox that is not running (see [Supervisor.Delete]).
func (s *Supervisor) Deprovision(ctx context.Context, id string) error {
	return s.Delete(ctx, id, false)
}

// Delete removes a sandbox. Without force it refuses a running one (sandbox-launched); with
// force it first kills it, as a forced stop does (also a paused one, and one that another
// runtime identity runs), under the same lock, so that nothing can start the sandbox between
// the stop and the removal. A clone's binding is removed first, durably, under the lock; its
// lease is released once the lock is gone.
func (s *Supervisor) Delete(ctx context.Context, id string, force bool) (err error) {
	defer s.observe("deprovision", time.Now(), &err)
	l, _, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return err
	}
	return s.deleteLocked(ctx, l, force)
}

// deleteLocked is [Supervisor.Delete] of the sandbox l locks; it releases l.
func (s *Supervisor) deleteLocked(ctx context.Context, l *store.Lock, force bool) error {
	id := l.ID()
	r, err := s.reattach(ctx, l)
	if err != nil {
		s.unlock(l)
		return err
	}
	if r.state == StateRunning { // under any runtime identity
		if !force {
			s.unlock(l)
			return errcode.New(errcode.SandboxLaunched, "Sandbox %s is running; stop it before deleting it, or delete it with force=true.", id)
		}
		o, err := s.stopLocked(ctx, l, r.rec, true)
		if err != nil {
			s.unlock(l)
			return err
		}
		s.emit(Event{Type: EventStopped, Sandbox: id, State: StateStopped, Exit: o})
	}
	return s.deprovisionLocked(ctx, l)
}

// deprovisionLocked removes the sandbox that l locks, which runs no launch, and releases l.
func (s *Supervisor) deprovisionLocked(ctx context.Context, l *store.Lock) error {
	id := l.ID()
	cfg, err := l.Config()
	if err != nil {
		s.unlock(l)
		return err
	}
	binding, err := releaseBinding(l)
	if err != nil {
		s.unlock(l)
		return err
	}
	s.detachNetwork(id)
	// Once Deprovision removed the lock file it has released the lock; Unlock is then a no-op.
	err = l.Deprovision(ctx)
	s.unlock(l)
	// The binding is gone whatever the removal did, so the lease goes too.
	s.releaseLease(ctx, id, binding)
	if err == nil {
		s.releaseVolumes(id, cfg.Volumes)
		s.releaseImage(ctx, cfg.Image, image.UseSandbox, id)
		s.forgetSandbox(id)
		s.emit(Event{Type: EventDeleted, Sandbox: id})
	}
	return err
}
