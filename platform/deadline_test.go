package platform

import (
	"encoding/json"
	"testing"
	"time"
)

func TestDeadlineAcrossClockJumps(t *testing.T) {
	t.Parallel()
	set := Instant{UTC: time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC), BootID: "boot-a", Boottime: time.Hour}
	dl := DeadlineAfter(set, 10*time.Minute)
	// later returns the instant elapsed after set on the same boot, with the wall clock
	// jumped by jump.
	later := func(elapsed, jump time.Duration) Instant {
		return Instant{UTC: set.UTC.Add(elapsed + jump), BootID: set.BootID, Boottime: set.Boottime + elapsed}
	}
	cases := []struct {
		name    string
		now     Instant
		expired bool
	}{
		{"just set", later(0, 0), false},
		{"a minute in", later(time.Minute, 0), false},
		{"at the deadline", later(10*time.Minute, 0), true},
		{"past it", later(11*time.Minute, 0), true},
		{"wall clock a year forward, a minute in", later(time.Minute, 365*24*time.Hour), false},
		{"wall clock a year back, past it", later(11*time.Minute, -365*24*time.Hour), true},
		{"wall clock back an hour, just before", later(9*time.Minute, -time.Hour), false},
		// After a reboot only the wall clock is left.
		{"rebooted, before by UTC", Instant{UTC: set.UTC.Add(5 * time.Minute), BootID: "boot-b", Boottime: time.Minute}, false},
		{"rebooted, after by UTC", Instant{UTC: set.UTC.Add(20 * time.Minute), BootID: "boot-b", Boottime: 2 * time.Hour}, true},
		{"no boottime now", Instant{UTC: set.UTC.Add(20 * time.Minute)}, true},
	}
	for _, tc := range cases {
		if got := dl.Expired(tc.now); got != tc.expired {
			t.Errorf("%s: Expired = %v, want %v (remaining %v)", tc.name, got, tc.expired, dl.Remaining(tc.now))
		}
	}
	if (Deadline{}).Expired(later(100*time.Hour, 0)) {
		t.Error("the zero deadline expired")
	}
	wallOnly := DeadlineAfter(Instant{UTC: set.UTC}, time.Minute)
	if wallOnly.BootID != "" || wallOnly.Expired(later(0, 0)) || !wallOnly.Expired(later(2*time.Minute, 0)) {
		t.Errorf("a deadline set without boottime is not judged by UTC: %+v", wallOnly)
	}
}

func TestDeadlineJSON(t *testing.T) {
	t.Parallel()
	dl := DeadlineAfter(Instant{UTC: time.Date(2030, 1, 1, 12, 0, 0, 5, time.UTC), BootID: "boot-a", Boottime: time.Hour}, time.Minute)
	b, err := json.Marshal(dl)
	if err != nil {
		t.Fatal(err)
	}
	var back Deadline
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	if !back.UTC.Equal(dl.UTC) || back.BootID != dl.BootID || back.Boottime != dl.Boottime {
		t.Fatalf("round trip: %+v, want %+v (%s)", back, dl, b)
	}
	for _, bad := range []string{
		`{"utc":"2030-01-01T00:00:00Z","boot_id":"x"}`,
		`{"utc":"2030-01-01T00:00:00Z","boottime_ns":5}`,
		`{"utc":"2030-01-01T00:00:00Z","boot_id":"x","boottime_ns":-5}`,
		`{"boot_id":"x","boottime_ns":5}`,
	} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("decoded %s, want it refused", bad)
		}
	}
}

func TestNowOnThisHost(t *testing.T) {
	t.Parallel()
	a := Now()
	dl := DeadlineAfter(a, time.Hour)
	if dl.Expired(Now()) {
		t.Fatalf("a deadline an hour from now expired at once: %+v", dl)
	}
	if dl.Remaining(Now()) > time.Hour {
		t.Fatalf("remaining %v, more than it was set for", dl.Remaining(Now()))
	}
}
