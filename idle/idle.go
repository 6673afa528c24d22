package idle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// BusyShare is the share of one CPU that the work inside a sandbox must use, between two
// ticks, to keep it awake (unless its policy ignores work): above a shell's or an idle
// server's housekeeping.
const BusyShare = 0.02

// DefaultTick is how often a [Tracker.Watch] looks.
const DefaultTick = time.Second

// Tracker keeps the last use and the uses in flight of each sandbox. Its methods are safe
// for concurrent use; Touch and Begin take one mutex and never block on anything else.
type Tracker struct {
	now func() time.Time

	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	last      time.Time // last use
	busy      int       // uses in flight
	persisted time.Time // the last use as recorded durably
	cpu       time.Duration
	cpuAt     time.Time
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker { return &Tracker{now: time.Now, m: map[string]*entry{}} }

func (t *Tracker) entry(id string) *entry {
	e := t.m[id]
	if e == nil {
		e = &entry{last: t.now()}
		t.m[id] = e
	}
	return e
}

// Touch records a use of sandbox id now.
func (t *Tracker) Touch(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entry(id).last = t.now()
}

// Begin records a use of sandbox id that lasts until end is called (once; later calls do
// nothing): the sandbox is not idle meanwhile, and its end is a use too.
func (t *Tracker) Begin(id string) (end func()) {
	t.mu.Lock()
	e := t.entry(id)
	e.busy++
	e.last = t.now()
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			if e := t.m[id]; e != nil {
				e.busy = max(0, e.busy-1)
				e.last = t.now()
			}
		})
	}
}

// Idle reports whether sandbox id has nothing in flight and no use for timeout: the look a
// sleep takes again under the sandbox's lock, after the watch's.
func (t *Tracker) Idle(id string, timeout time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[id]
	return e == nil || (e.busy == 0 && t.now().Sub(e.last) >= timeout)
}

// Forget drops what the tracker keeps of sandbox id (it was deleted, or no longer sleeps).
func (t *Tracker) Forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, id)
}

// Candidate is a running, awake sandbox with a sleep policy.
type Candidate struct {
	ID         string
	Timeout    time.Duration
	IgnoreWork bool
}

// WatchConfig is what [Tracker.Watch] needs of the supervisor.
type WatchConfig struct {
	// Candidates lists the sandboxes that may be put to sleep now.
	Candidates func() ([]Candidate, error)
	// CPU reads the CPU time a sandbox used since its launch; nil: work is never seen.
	CPU func(id string) (time.Duration, error)
	// Sleep puts a sandbox to sleep.
	Sleep func(ctx context.Context, id string) error
	// Persist records a sandbox's last use durably; Load reads it back (ok false: none).
	Persist func(id string, last time.Time) error
	Load    func(id string) (last time.Time, ok bool)
	Tick    time.Duration
	Logger  *slog.Logger
}

// Watch puts idle sandboxes to sleep, looking every tick, until ctx ends.
func (t *Tracker) Watch(ctx context.Context, cfg WatchConfig) {
	if cfg.Tick <= 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	tk := time.NewTicker(cfg.Tick)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		t.Check(ctx, cfg)
	}
}

// Check looks at every candidate once: it sees work, records last uses, and puts to sleep
// those idle for their timeout.
func (t *Tracker) Check(ctx context.Context, cfg WatchConfig) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cands, err := cfg.Candidates()
	if err != nil {
		cfg.Logger.Warn("idle: the sandboxes that may sleep do not list", "err", err)
		return
	}
	for _, c := range cands {
		t.known(c, cfg)
		if !c.IgnoreWork && cfg.CPU != nil {
			if cpu, err := cfg.CPU(c.ID); err == nil && t.sawCPU(c.ID, cpu) {
				cfg.Logger.Debug("idle: the work inside keeps a sandbox awake", "sandbox", c.ID, "cpu", cpu)
			}
		}
		last, idle, persist := t.judge(c)
		if persist && cfg.Persist != nil {
			if err := cfg.Persist(c.ID, last); err != nil {
				cfg.Logger.Warn("idle: the last use of a sandbox is not recorded", "sandbox", c.ID, "err", err)
			} else {
				t.mu.Lock()
				if e := t.m[c.ID]; e != nil {
					e.persisted = last
				}
				t.mu.Unlock()
			}
		}
		if !idle {
			continue
		}
		cfg.Logger.Info("idle: putting a sandbox to sleep", "sandbox", c.ID, "idle_for", t.now().Sub(last).Round(time.Second))
		if err := cfg.Sleep(ctx, c.ID); err != nil {
			cfg.Logger.Warn("idle: a sandbox did not go to sleep", "sandbox", c.ID, "err", err)
		}
		// Asleep (or not): the next use starts a new idle period either way.
		t.Touch(c.ID)
	}
}

// known makes sure the tracker has c, with the recorded last use (plus the quarter of the
// timeout that a record may be late by) for a sandbox seen first since the start.
func (t *Tracker) known(c Candidate, cfg WatchConfig) {
	t.mu.Lock()
	_, ok := t.m[c.ID]
	t.mu.Unlock()
	if ok {
		return
	}
	var last time.Time
	var found bool
	if cfg.Load != nil {
		last, found = cfg.Load(c.ID)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[c.ID]; ok {
		return // touched meanwhile
	}
	e := &entry{last: t.now()}
	if found {
		e.persisted = last
		if at := last.Add(c.Timeout / 4); at.Before(e.last) {
			e.last = at
		}
	}
	t.m[c.ID] = e
}

// sawCPU counts the CPU the work used since the last tick as a use, above BusyShare, and
// says whether it did.
func (t *Tracker) sawCPU(id string, cpu time.Duration) (busy bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	now := t.now()
	if !e.cpuAt.IsZero() && cpu > e.cpu {
		if dt := now.Sub(e.cpuAt); dt > 0 && float64(cpu-e.cpu) > BusyShare*float64(dt) {
			e.last, busy = now, true
		}
	}
	e.cpu, e.cpuAt = cpu, now
	return busy
}

// judge says c's last use, whether it is idle for its timeout, and whether its last use is
// due to be recorded.
func (t *Tracker) judge(c Candidate) (last time.Time, idle, persist bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(c.ID)
	now := t.now()
	idle = e.busy == 0 && now.Sub(e.last) >= c.Timeout
	persist = e.last.Sub(e.persisted) >= c.Timeout/4
	return e.last, idle, persist
}
