package supervisor

import (
	"context"
	"errors"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/idle"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
)

// Sleep and wake (issue 41): a sandbox with a sleep policy (Config.Sleep) is paused, as
// [Supervisor.Pause] pauses it, once it has gone unused for its idle timeout ([idle.Tracker]
// keeps the clock, and its Watch calls [Supervisor.Sleep]); its pause record says why
// (Reason [PauseIdle]), so a restart keeps it asleep. With AutoResume, the next request that
// needs it (an exec, a stream, a file call, a port connection) wakes it: the request waits up
// to [defaultWakeWait] for the resume, which goes on without it, and is then served, or answered
// sandbox-waking to retry.

// PauseIdle is the pause record's Reason of a sandbox put to sleep.
const PauseIdle = "idle"

// The events of a sleep and a wake, besides the pause's and the resume's own.
const (
	EventAsleep = "sandbox.asleep"
	EventAwake  = "sandbox.awake"
)

// ActivityName is the record of a sleeping sandbox's last use (idle.WatchConfig.Persist),
// and activityFormat its format.
const (
	ActivityName   = "activity.json"
	activityFormat = 1
)

// MaxIdleTimeoutS bounds a sleep policy's idle timeout: 30 days, as a lifetime.
const MaxIdleTimeoutS = 30 * 24 * 3600

// defaultWakeWait is how long a request waits for the wake it caused (Supervisor.wakeWait);
// wakeTimeout how long the wake itself may take (a microVM's release restores its memory).
const (
	defaultWakeWait = 20 * time.Second
	wakeTimeout     = 2 * time.Minute
)

// wake is a wake under way, shared by every request that waits for it.
type wake struct {
	done chan struct{}
	err  error
}

type activityRecord struct {
	Format int       `json:"format"`
	Last   time.Time `json:"last"`
}

func checkSleep(p *SleepPolicy) error {
	if p == nil {
		return nil
	}
	if p.IdleTimeoutS < 1 || p.IdleTimeoutS > MaxIdleTimeoutS {
		return errcode.Invalid("sleep.idle_timeout_seconds", "The idle timeout must be 1 to %d seconds.", MaxIdleTimeoutS)
	}
	return nil
}

// Activity is the idle clock of the sandboxes with a sleep policy.
func (s *Supervisor) Activity() *idle.Tracker { return s.activity }

// use records a use of sandbox id (whose configuration is cfg) that lasts until the returned
// function is called; a sandbox without a sleep policy has no clock.
func (s *Supervisor) use(cfg *Config) (end func()) {
	if cfg == nil || cfg.Sleep == nil {
		return func() {}
	}
	return s.activity.Begin(cfg.ID)
}

// errNotIdle is a sleep called off: the sandbox was used since the watch judged it idle.
var errNotIdle = errors.New("supervisor: the sandbox was used since it was judged idle")

// sleepCalledOff says a pause for reason is a sleep of the sandbox cfg configures that must
// not happen: it no longer has a policy, or it was used since the watch judged it idle.
func (s *Supervisor) sleepCalledOff(reason string, cfg *Config) bool {
	if reason != PauseIdle {
		return false
	}
	return cfg.Sleep == nil || !s.activity.Idle(cfg.ID, time.Duration(cfg.Sleep.IdleTimeoutS)*time.Second)
}

// emitPaused tells of a pause, and of a sleep when it is one.
func (s *Supervisor) emitPaused(id, reason string) {
	s.emit(Event{Type: EventPaused, Sandbox: id, State: StatePaused})
	if reason == PauseIdle {
		s.emit(Event{Type: EventAsleep, Sandbox: id, State: StatePaused})
	}
}

// sleepTimeout bounds a sleep's pause, as a pause request's default timeout would.
const sleepTimeout = time.Minute

// Use records a use of sandbox id that lasts until end is called (a proxied request, a port
// tunnel), after waking the sandbox if it sleeps and its policy says so. A sandbox without a
// sleep policy has no clock, and end does nothing. A request that reuses a pooled connection
// to a port reaches no dial: it wakes the sandbox here.
func (s *Supervisor) Use(ctx context.Context, id string) (end func(), err error) {
	cfg, err := s.wakeIfAsleep(ctx, id)
	if err != nil {
		return func() {}, err
	}
	return s.use(cfg), nil
}

// Sleep puts a running sandbox to sleep: it pauses it, recording why. A sandbox whose runtime
// can release a paused sandbox's memory (a microVM, [runtime.MemoryReleaser]) sleeps with its
// memory released, given back to the host until the wake restores it.
func (s *Supervisor) Sleep(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, sleepTimeout)
	defer cancel()
	p, err := s.sandboxPauser(id)
	if err != nil {
		return err
	}
	_, release := p.(runtime.MemoryReleaser)
	_, err = s.pause(ctx, id, release, PauseIdle)
	if errors.Is(err, errNotIdle) {
		return nil
	}
	return err
}

// noteSleeper records whether sandbox id has a sleep policy, from its configuration.
func (s *Supervisor) noteSleeper(id string) {
	cfg, err := s.store.ReadConfigUnlocked(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && cfg != nil && cfg.Sleep != nil {
		s.sleepers[id] = true
	} else {
		delete(s.sleepers, id)
	}
}

// SleepCandidates lists the running, awake sandboxes with a sleep policy, for the idle watch.
// It reads those with a policy alone: the watch runs every second, and a listing of every
// sandbox would cost it the whole state root's (230 ms at 4000 sandboxes).
func (s *Supervisor) SleepCandidates() ([]idle.Candidate, error) {
	s.mu.Lock()
	ids := make([]string, 0, len(s.sleepers))
	for id := range s.sleepers {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	var out []idle.Candidate
	for _, id := range ids {
		st, err := s.Status(id)
		if err != nil {
			continue // deleted meanwhile: its delete forgets it
		}
		p := st.Config.Sleep
		if p == nil || st.State != StateRunning || st.RuntimeMismatch {
			continue
		}
		out = append(out, idle.Candidate{ID: st.Config.ID, Timeout: time.Duration(p.IdleTimeoutS) * time.Second, IgnoreWork: p.IgnoreWork})
	}
	return out, nil
}

// SleepCPU reads a sandbox's CPU time for the idle watch, where its runtime measures it.
func (s *Supervisor) SleepCPU(id string) (time.Duration, error) {
	_, u, err := s.Usage(id)
	return u.CPU, err
}

// RecordActivity records a sandbox's last use durably ([ActivityName]).
func (s *Supervisor) RecordActivity(id string, last time.Time) error {
	dir, err := s.store.Dir(id)
	if err != nil {
		return err
	}
	data, err := record.Encode(&activityRecord{Format: activityFormat, Last: last.UTC()})
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(dir, ActivityName, data, record.Perm)
}

// LastActivity reads a sandbox's recorded last use.
func (s *Supervisor) LastActivity(id string) (time.Time, bool) {
	dir, err := s.store.Dir(id)
	if err != nil {
		return time.Time{}, false
	}
	var a activityRecord
	if found, err := readOwnRecord(dir, ActivityName, activityFormat, &a); err != nil || !found {
		return time.Time{}, false
	}
	return a.Last, true
}

// wakeIfAsleep wakes sandbox id if it is paused and its policy says use wakes it, and waits
// for the wake up to [defaultWakeWait] (or ctx). It returns the sandbox's configuration, read
// without its lock (nil when it does not read: the caller's own look reports that), or nil
// for a sandbox this process knows has no sleep policy: every exec and file call passes here,
// and those sandboxes cost it no read of their record.
func (s *Supervisor) wakeIfAsleep(ctx context.Context, id string) (*Config, error) {
	s.mu.Lock()
	_, sleeper := s.sleepers[id]
	_, waking := s.wakes[id]
	s.mu.Unlock()
	if !sleeper && !waking {
		return nil, nil
	}
	cfg, err := s.store.ReadConfigUnlocked(id)
	if err != nil || cfg == nil {
		return nil, nil //nolint:nilerr // the caller's own look answers for a missing sandbox
	}
	if cfg.Sleep == nil || !cfg.Sleep.AutoResume {
		return cfg, nil
	}
	// A wake under way is joined whatever the sandbox reads: its resume removes the pause
	// record before it thaws, and a request must wait for the wake, not for its lock.
	s.mu.Lock()
	w, waking := s.wakes[id]
	s.mu.Unlock()
	if !waking {
		st, err := s.Status(id)
		if err != nil || st.State != StatePaused {
			return cfg, nil //nolint:nilerr // as above
		}
		w = s.startWake(id)
	}
	s.activity.Touch(id)
	wait := time.NewTimer(s.wakeWait)
	defer wait.Stop()
	select {
	case <-w.done:
		if w.err != nil {
			return cfg, w.err
		}
		return cfg, nil
	case <-wait.C:
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.Canceled) {
			return cfg, ctx.Err()
		}
	}
	return cfg, errcode.New(errcode.SandboxWaking, "Sandbox %s is waking from its sleep; retry in a few seconds.", id)
}

// startWake starts the wake of sandbox id, or joins the one under way. The wake runs on
// whether or not its requests wait for it.
func (s *Supervisor) startWake(id string) *wake {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.wakes[id]; ok {
		return w
	}
	if s.closed {
		w := &wake{done: make(chan struct{}), err: errcode.New(errcode.Unavailable, "The server is shutting down; retry once it is back.")}
		close(w.done)
		return w
	}
	w := &wake{done: make(chan struct{})}
	s.wakes[id] = w
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), wakeTimeout)
		defer cancel()
		_, err := s.Resume(ctx, id)
		if err != nil {
			s.log.Warn("a sleeping sandbox did not wake", "sandbox", id, "err", err)
		}
		s.mu.Lock()
		w.err = err
		delete(s.wakes, id)
		s.mu.Unlock()
		close(w.done)
	}()
	return w
}
