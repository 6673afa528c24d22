package supervisor

import (
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
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
