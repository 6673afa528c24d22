package idle

import (
	"context"
	"testing"
	"time"
)

// clock is a test's time, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newTracker(c *clock) *Tracker   { t := NewTracker(); t.now = c.now; return t }
func one(c Candidate) func() ([]Candidate, error) {
	return func() ([]Candidate, error) { return []Candidate{c}, nil }
}

func TestTrackerSleepsWhenIdle(t *testing.T) {
	t.Parallel()
	ck := &clock{t: time.Unix(1000, 0)}
	tr := newTracker(ck)
	var slept []string
	var cpu time.Duration
	var persisted []time.Time
	cfg := WatchConfig{
		Candidates: one(Candidate{ID: "a", Timeout: 10 * time.Second}),
		CPU:        func(string) (time.Duration, error) { return cpu, nil },
		Sleep:      func(_ context.Context, id string) error { slept = append(slept, id); return nil },
		Persist:    func(_ string, last time.Time) error { persisted = append(persisted, last); return nil },
	}
	ctx := context.Background()
	tr.Check(ctx, cfg) // first sight: a full timeout from now
	ck.add(9 * time.Second)
	tr.Check(ctx, cfg)
	if len(slept) != 0 {
		t.Fatal("asleep before its timeout")
	}
	// A stream in flight keeps it awake past the timeout.
	end := tr.Begin("a")
	ck.add(20 * time.Second)
	tr.Check(ctx, cfg)
	if len(slept) != 0 {
		t.Fatal("asleep with a stream in flight")
	}
	end()
	end() // a second end does nothing
	// Work inside (more than BusyShare of a CPU) keeps it awake too.
	for range 12 {
		ck.add(time.Second)
		cpu += 500 * time.Millisecond
		tr.Check(ctx, cfg)
	}
	if len(slept) != 0 {
		t.Fatal("asleep while its work used half a CPU")
	}
	ck.add(10 * time.Second)
	tr.Check(ctx, cfg)
	if len(slept) != 1 {
		t.Fatalf("not asleep 10 s after its last use: %v", slept)
	}
	if len(persisted) == 0 {
		t.Fatal("no last use was recorded")
	}
}

func TestTrackerIgnoresWorkWhenAsked(t *testing.T) {
	t.Parallel()
	ck := &clock{t: time.Unix(1000, 0)}
	tr := newTracker(ck)
	var cpu time.Duration
	slept := 0
	cfg := WatchConfig{
		Candidates: one(Candidate{ID: "a", Timeout: 5 * time.Second, IgnoreWork: true}),
		CPU:        func(string) (time.Duration, error) { return cpu, nil },
		Sleep:      func(context.Context, string) error { slept++; return nil },
	}
	for range 6 {
		tr.Check(context.Background(), cfg)
		ck.add(time.Second)
		cpu += time.Second
	}
	if slept != 1 {
		t.Fatalf("slept %d times, want once: its busy work does not count", slept)
	}
}

func TestTrackerResumesItsTimerAfterARestart(t *testing.T) {
	t.Parallel()
	ck := &clock{t: time.Unix(1000, 0)}
	tr := newTracker(ck)
	recorded := ck.t.Add(-100 * time.Second) // used 100 s before this server started
	slept := 0
	cfg := WatchConfig{
		Candidates: one(Candidate{ID: "a", Timeout: 120 * time.Second}),
		Sleep:      func(context.Context, string) error { slept++; return nil },
		Load:       func(string) (time.Time, bool) { return recorded, true },
	}
	tr.Check(context.Background(), cfg)
	// The record may be a quarter timeout (30 s) late: the timer ends at 100+30-120 = ...
	// 50 s from now, not a whole timeout from now.
	ck.add(49 * time.Second)
	tr.Check(context.Background(), cfg)
	if slept != 0 {
		t.Fatal("asleep before the recorded use plus a quarter and the timeout")
	}
	ck.add(2 * time.Second)
	tr.Check(context.Background(), cfg)
	if slept != 1 {
		t.Fatal("the restart restarted the idle timer instead of running it on")
	}
}

func TestTrackerIdleLooksAgain(t *testing.T) {
	t.Parallel()
	ck := &clock{t: time.Unix(1000, 0)}
	tr := newTracker(ck)
	tr.Touch("a")
	ck.add(10 * time.Second)
	if !tr.Idle("a", 10*time.Second) {
		t.Fatal("not idle 10 s after its last use")
	}
	end := tr.Begin("a") // a use that began after the watch judged it
	if tr.Idle("a", 10*time.Second) {
		t.Fatal("idle with a use in flight")
	}
	end()
	if tr.Idle("a", 10*time.Second) {
		t.Fatal("idle right after a use ended")
	}
}
