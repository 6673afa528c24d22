package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

// TestRetry checks what Retry does with each Attempt and error an attempt reports.
func TestRetry(t *testing.T) {
	t.Parallel()
	errAttempt := errors.New("the attempt's own error")
	errBusy := errors.New("busy until the deadline")
	type step struct {
		res Attempt
		err error
	}
	tests := []struct {
		name     string
		steps    []step // the last one repeats
		timeout  time.Duration
		want     error        // nil, errAttempt or errBusy
		wantCode errcode.Code // instead of want, when not ""
		attempts int          // attempts made; 0: do not check
	}{
		{"acquired at once", []step{{Acquired, nil}}, 10 * time.Second, nil, "", 1},
		{"failed with its error", []step{{Failed, errAttempt}}, 10 * time.Second, errAttempt, "", 1},
		{"an error wins over acquired", []step{{Acquired, errAttempt}}, 10 * time.Second, errAttempt, "", 1},
		{"an error wins over busy", []step{{Busy, errAttempt}}, 10 * time.Second, errAttempt, "", 1},
		{"failed without an error is a bug", []step{{Failed, nil}}, 10 * time.Second, nil, errcode.Internal, 1},
		{"an unknown attempt is a bug", []step{{Attempt(99), nil}}, 10 * time.Second, nil, errcode.Internal, 1},
		{"raced, then acquired", []step{{Raced, nil}, {Raced, nil}, {Acquired, nil}}, 10 * time.Second, nil, "", 3},
		{"busy, then acquired", []step{{Busy, nil}, {Acquired, nil}}, 10 * time.Second, nil, "", 2},
		{"raced, then failed", []step{{Raced, nil}, {Failed, errAttempt}}, 10 * time.Second, errAttempt, "", 2},
		{"busy until the deadline", []step{{Busy, nil}}, 3 * RetryInterval, errBusy, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			defer cancel()
			n := 0
			err := Retry(ctx, func() error { return errBusy }, func() (Attempt, error) {
				s := tt.steps[min(n, len(tt.steps)-1)]
				n++
				return s.res, s.err
			})
			if tt.wantCode != "" {
				if errcode.Of(err) != tt.wantCode {
					t.Fatalf("Retry = %v; want %s", err, tt.wantCode)
				}
			} else if err != tt.want {
				t.Fatalf("Retry = %v; want %v", err, tt.want)
			}
			if tt.attempts != 0 && n != tt.attempts {
				t.Fatalf("Retry made %d attempts; want %d", n, tt.attempts)
			}
		})
	}
}

func TestAttemptString(t *testing.T) {
	t.Parallel()
	for a, want := range map[Attempt]string{Failed: "failed", Acquired: "acquired", Busy: "busy", Raced: "raced", Attempt(7): "Attempt(7)"} {
		if got := a.String(); got != want {
			t.Errorf("Attempt(%d).String() = %q; want %q", int(a), got, want)
		}
	}
}
