package supervisor

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/runtime"
)

// TestSleepRacesAUse: a sleep called while a use is in flight (an exec admitted after the
// watch judged the sandbox idle) leaves the sandbox awake; once idle it sleeps, asleep in its
// status and its events; an exec wakes it and is admitted; without auto_resume an exec is
// refused sandbox-paused.
func TestSleepRacesAUse(t *testing.T) {
	s, _ := newSupervisor(t)
	requirePause(t, s)
	ctx := testContext(t)
	for _, id := range []string{"nap", "nowake"} {
		st, err := s.Create(ctx, CreateRequest{ID: id, Start: true, Sleep: &SleepPolicy{IdleTimeoutS: 1, AutoResume: id == "nap"}})
		if err != nil || st.State != StateRunning {
			t.Fatalf("create %s: %+v, %v", id, st, err)
		}
	}

	end := s.Activity().Begin("nap")
	if err := s.Sleep(ctx, "nap"); err != nil {
		t.Fatalf("a sleep beside a use: %v", err)
	}
	if st, _ := s.Status("nap"); st.State != StateRunning {
		t.Fatalf("a sleep beside a use in flight paused the sandbox: %s", st.State)
	}
	end()

	deadline := time.Now().Add(10 * time.Second)
	for !s.Activity().Idle("nap", time.Second) || !s.Activity().Idle("nowake", time.Second) {
		if time.Now().After(deadline) {
			t.Fatal("the sandboxes did not become idle")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, id := range []string{"nap", "nowake"} {
		if err := s.Sleep(ctx, id); err != nil {
			t.Fatalf("sleep %s: %v", id, err)
		}
		if st, _ := s.Status(id); st.State != StatePaused || !st.Asleep {
			t.Fatalf("%s after its sleep: %s, asleep %v", id, st.State, st.Asleep)
		}
	}

	a, err := s.AdmitExec(ctx, "nap", time.Second)
	if err != nil {
		t.Fatalf("an exec in the sleeping sandbox: %v", err)
	}
	a.Release()
	if st, _ := s.Status("nap"); st.State != StateRunning || st.Asleep {
		t.Fatalf("after the exec that woke it: %s, asleep %v", st.State, st.Asleep)
	}
	if _, err := s.AdmitExec(ctx, "nowake", 100*time.Millisecond); errcode.Of(err) != errcode.SandboxPaused {
		t.Fatalf("an exec in a sleeping sandbox without auto_resume: %v, want sandbox-paused", err)
	}
}

// slowThaw is the namespace runtime whose thaws wait until release is closed.
type slowThaw struct {
	runtime.Runtime
	release chan struct{}
}

func (r slowThaw) pauser() runtime.Pauser              { return r.Runtime.(runtime.Pauser) }
func (r slowThaw) PauseSupport() error                 { return r.pauser().PauseSupport() }
func (r slowThaw) Frozen(id, dir string) (bool, error) { return r.pauser().Frozen(id, dir) }
func (r slowThaw) Freeze(ctx context.Context, id, dir string) error {
	return r.pauser().Freeze(ctx, id, dir)
}
func (r slowThaw) Thaw(ctx context.Context, id, dir string) error {
	select {
	case <-r.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return r.pauser().Thaw(ctx, id, dir)
}

// TestWakeTooSlowIsWaking: a request that wakes a sandbox whose wake outlasts the request's
// wait answers sandbox-waking; the wake goes on, one for every request, and once it is done
// a request is served.
func TestWakeTooSlowIsWaking(t *testing.T) {
	requireRoot(t)
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	s, _ := openWithEvents(t, t.TempDir(), func(rt runtime.Runtime) runtime.Runtime { return slowThaw{Runtime: rt, release: release} })
	t.Cleanup(func() {
		// As newSupervisor's cleanup: a sandbox outlives its supervisor's Close, so it is
		// stopped and removed first, or its shim and init run on after the test.
		open()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = s.Stop(ctx, "slow", true)
		_ = s.Deprovision(ctx, "slow")
		s.Close()
	})
	requirePause(t, s)
	s.wakeWait = 50 * time.Millisecond
	ctx := testContext(t)
	if _, err := s.Create(ctx, CreateRequest{ID: "slow", Start: true, Sleep: &SleepPolicy{IdleTimeoutS: 3600, AutoResume: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := s.AdmitExec(ctx, "slow", time.Second); errcode.Of(err) != errcode.SandboxWaking {
			t.Fatalf("an exec whose wake outlasts its wait: %v, want sandbox-waking", err)
		}
	}
	s.mu.Lock()
	wakes := len(s.wakes)
	s.mu.Unlock()
	if wakes != 1 {
		t.Fatalf("%d wakes under way, want the one the requests share", wakes)
	}
	open()
	s.wakeWait = defaultWakeWait
	a, err := s.AdmitExec(ctx, "slow", time.Second)
	if err != nil {
		t.Fatalf("an exec once the wake is done: %v", err)
	}
	a.Release()
}
