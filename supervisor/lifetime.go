package supervisor

import (
	"context"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// LifetimeName is a sandbox's lifetime record, and lifetimeFormat its record format.
const (
	LifetimeName   = "lifetime.json"
	lifetimeFormat = 1
)

// Bounds of a lifetime.
const (
	MinLifetime = time.Second
	MaxLifetime = 30 * 24 * time.Hour
)

// OnTimeout is what the end of a sandbox's lifetime does to it.
type OnTimeout string

// The actions of [OnTimeout].
const (
	// TimeoutStop stops the sandbox (gracefully, then by force); it stays, stopped.
	TimeoutStop OnTimeout = "stop"
	// TimeoutDelete stops the sandbox and deletes it.
	TimeoutDelete OnTimeout = "delete"
)

// ReasonExpired is the [Exit] reason of a run that its lifetime's end stopped.
const ReasonExpired runtime.Reason = "expired"

// EventExpired is the event of a sandbox whose lifetime ended; it comes before the stop's or
// deletion's own event.
const EventExpired = "sandbox.expired"

// Lifetime bounds how long a sandbox lives, from when it is set.
type Lifetime struct {
	Timeout   time.Duration
	OnTimeout OnTimeout // "" means TimeoutStop
}

// deadline is lifetime.json. It keeps how long the lifetime is and when it was set twice: by
// the wall clock (UTC), and by CLOCK_BOOTTIME with the boot id. While the host has not
// rebooted, the time left is measured by CLOCK_BOOTTIME, which nothing sets: a jump of the
// wall clock, forward or back, neither expires a lifetime early nor keeps it forever. After a
// reboot (another boot id) BOOTTIME restarted, and the wall clock is all there is; a wall
// clock that went back before SetAt counts as no time passed, so a lifetime still ends at
// most Timeout after the restart.
type deadline struct {
	Format        int       `json:"format"`
	TimeoutMS     int64     `json:"timeout_ms"`
	OnTimeout     OnTimeout `json:"on_timeout"`
	SetAt         time.Time `json:"set_at"`
	BootID        string    `json:"boot_id,omitempty"`
	SetBoottimeNS int64     `json:"set_boottime_ns,omitempty"`
}

func checkLifetime(lt *Lifetime) error {
	if lt == nil {
		return nil
	}
	if lt.Timeout < MinLifetime || lt.Timeout > MaxLifetime {
		return errcode.Invalid("timeout_s", "The lifetime must be between 1 second and 30 days; send 0 to clear it.")
	}
	switch lt.OnTimeout {
	case "", TimeoutStop, TimeoutDelete:
		return nil
	}
	return errcode.Invalid("on_timeout", "on_timeout must be stop or delete.")
}

// newDeadline is the record of lt set at now.
func newDeadline(lt Lifetime, now time.Time) *deadline {
	d := &deadline{Format: lifetimeFormat, TimeoutMS: lt.Timeout.Milliseconds(), OnTimeout: lt.OnTimeout, SetAt: now.UTC()}
	if d.OnTimeout == "" {
		d.OnTimeout = TimeoutStop
	}
	if boot, err := platform.BootID(); err == nil {
		if bt, err := platform.Boottime(); err == nil {
			d.BootID, d.SetBoottimeNS = boot, int64(bt)
		}
	}
	return d
}

// left is how much of the lifetime remains (negative once it is over).
func (d *deadline) left(now time.Time) time.Duration {
	timeout := time.Duration(d.TimeoutMS) * time.Millisecond
	if d.BootID != "" {
		boot, berr := platform.BootID()
		bt, terr := platform.Boottime()
		if berr == nil && terr == nil && boot == d.BootID && int64(bt) >= d.SetBoottimeNS {
			return timeout - (bt - time.Duration(d.SetBoottimeNS))
		}
	}
	elapsed := max(now.Sub(d.SetAt), 0)
	return timeout - elapsed
}

func writeDeadline(dir string, d *deadline) error {
	data, err := record.Encode(d)
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(dir, LifetimeName, data, record.Perm)
}

// readDeadline reads a sandbox's lifetime record; nil without one.
func readDeadline(dir string) (*deadline, error) {
	var d deadline
	if found, err := readOwnRecord(dir, LifetimeName, lifetimeFormat, &d); err != nil || !found {
		return nil, err
	}
	return &d, nil
}

func removeDeadline(dir string) error { return removeOwnRecord(dir, LifetimeName) }

// expiry reads when the sandbox in dir expires and what it does then; nil without a lifetime.
func (s *Supervisor) expiry(dir string) (*time.Time, OnTimeout) {
	d, err := readDeadline(dir)
	if err != nil || d == nil {
		return nil, ""
	}
	now := time.Now()
	at := now.Add(d.left(now)).UTC().Truncate(time.Second)
	return &at, d.OnTimeout
}

// SetTimeout sets a sandbox's lifetime anew from now, under its lock: the sandbox expires
// after lt.Timeout, whether it runs, is paused or is stopped. A nil lt clears it.
func (s *Supervisor) SetTimeout(ctx context.Context, id string, lt *Lifetime) (_ *Status, err error) {
	defer s.observe("timeout", time.Now(), &err)
	if err := checkLifetime(lt); err != nil {
		return nil, err
	}
	l, _, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(l)
	if lt == nil {
		err = removeDeadline(l.Dir())
	} else {
		err = writeDeadline(l.Dir(), newDeadline(*lt, time.Now()))
	}
	if err != nil {
		return nil, err
	}
	s.armLifetime(id)
	return s.Status(id)
}

// armLifetime sets (or resets, or clears) this process's timer for the sandbox's lifetime
// from its record. A lifetime already over fires at once.
func (s *Supervisor) armLifetime(id string) {
	// Where a sandbox becomes this process's (a create, a clone, a claim, a reattach), its
	// sleep policy does too (sleep.go).
	s.noteSleeper(id)
	dir, err := s.store.Dir(id)
	if err != nil {
		return
	}
	d, err := readDeadline(dir)
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.timers[id]; t != nil {
		t.Stop()
		delete(s.timers, id)
	}
	if err != nil || d == nil || s.closed {
		return
	}
	s.timers[id] = time.AfterFunc(max(d.left(time.Now()), 0), func() { s.expire(id) })
}

// forgetSandbox drops what this process keeps of a sandbox that is gone.
func (s *Supervisor) forgetSandbox(id string) {
	s.activity.Forget(id)
	s.mu.Lock()
	delete(s.sleepers, id)
	defer s.mu.Unlock()
	if t := s.timers[id]; t != nil {
		t.Stop()
		delete(s.timers, id)
	}
}

// expire ends a sandbox whose lifetime is over: an ordinary transition under its lock. A
// sandbox that another transition holds is retried until the lock is free (or the supervisor
// closes), never skipped.
func (s *Supervisor) expire(id string) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	for s.life.Err() == nil {
		err := s.expireOnce(id)
		if errcode.Of(err) != errcode.TransitionInProgress {
			if err != nil && errcode.Of(err) != errcode.SandboxNotFound {
				s.log.Error("ending a sandbox whose lifetime is over", "sandbox", id, "err", err)
				// Try again later rather than keep the sandbox forever.
				s.mu.Lock()
				if !s.closed {
					s.timers[id] = time.AfterFunc(5*time.Second, func() { s.expire(id) })
				}
				s.mu.Unlock()
			}
			return
		}
	}
}

func (s *Supervisor) expireOnce(id string) (err error) {
	defer s.observe("expire", time.Now(), &err)
	ctx, cancel := context.WithTimeout(s.life, s.grace+30*time.Second)
	defer cancel()
	l, _, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return err
	}
	d, err := readDeadline(l.Dir())
	if err != nil {
		s.unlock(l)
		return err
	}
	if d == nil || d.left(time.Now()) > 0 {
		// Cleared or set anew since the timer was armed.
		s.unlock(l)
		s.armLifetime(id)
		return nil
	}
	r, err := s.reattach(ctx, l)
	if err != nil {
		s.unlock(l)
		return err
	}
	var exit *Exit
	if r.state == StateRunning {
		if exit, err = s.stopExpired(ctx, l, r.rec); err != nil {
			s.unlock(l)
			return err
		}
	}
	if err := removeDeadline(l.Dir()); err != nil {
		s.unlock(l)
		return err
	}
	s.log.Info("sandbox lifetime over", "sandbox", id, "on_timeout", d.OnTimeout)
	s.emit(Event{Type: EventExpired, Sandbox: id, State: StateStopped, Exit: exit})
	if r.state == StateRunning {
		s.emit(Event{Type: EventStopped, Sandbox: id, State: StateStopped, Exit: exit})
	}
	if d.OnTimeout == TimeoutDelete {
		return s.deprovisionLocked(ctx, l)
	}
	s.unlock(l)
	s.forgetSandbox(id)
	return nil
}

// stopExpired stops an expired sandbox (gracefully, then by force) and records the outcome's
// reason as expired.
func (s *Supervisor) stopExpired(ctx context.Context, l *store.Lock, rec *store.RuntimeRecord) (*Exit, error) {
	gctx, cancel := context.WithTimeout(ctx, 2*s.grace+time.Second)
	o, err := s.stopLocked(gctx, l, rec, false)
	cancel()
	if err != nil {
		s.log.Warn("an expired sandbox did not stop in time; killing it", "sandbox", l.ID(), "err", err)
		if o, err = s.stopLocked(ctx, l, rec, true); err != nil {
			return nil, err
		}
	}
	if o == nil || o.LaunchID != rec.LaunchID {
		o = &runtime.Outcome{Format: runtime.OutcomeFormat, LaunchID: rec.LaunchID, ExitCode: -1}
	}
	o.Reason = ReasonExpired
	if o.At.IsZero() {
		o.At = time.Now().UTC()
	}
	if err := runtime.WriteOutcome(l.Dir(), o); err != nil {
		return nil, err
	}
	return o, nil
}
