package events

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bothy/bothy/openapi"
)

func sandboxEvent(id string) openapi.Event {
	return openapi.Event{Type: "sandbox.created", Sandbox: &id}
}

func next(t *testing.T, s *Subscription) openapi.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return e
}

func TestPublishNumbersAndStamps(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 15, 4, 5, 0, time.FixedZone("X", 3600))
	b := New(Options{Now: func() time.Time { return at }})
	s := b.Subscribe(false, 0)
	defer s.Close()
	for i := 1; i <= 3; i++ {
		sent := b.Publish(sandboxEvent("a"))
		if sent.Seq != int64(i) {
			t.Fatalf("event %d got seq %d", i, sent.Seq)
		}
		got := next(t, s)
		if got.Seq != int64(i) || !got.At.Equal(at) || got.At.Location() != time.UTC {
			t.Fatalf("event %d delivered as %+v", i, got)
		}
	}
	if b.Seq() != 3 {
		t.Fatalf("Seq = %d, want 3", b.Seq())
	}
}

func TestNilBusDropsEvents(t *testing.T) {
	t.Parallel()
	var b *Bus
	if e := b.Publish(sandboxEvent("a")); e.Seq != 0 {
		t.Fatalf("a nil bus numbered an event: %+v", e)
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()
	b := New(Options{History: 4})
	for i := 0; i < 6; i++ { // seqs 1..6; the ring keeps 3..6
		b.Publish(sandboxEvent("a"))
	}
	cases := []struct {
		name   string
		lastID int64
		want   []int64
	}{
		{"caught up", 6, nil},
		{"missed two", 4, []int64{5, 6}},
		{"just covered", 2, []int64{3, 4, 5, 6}},
		{"older than the ring", 1, []int64{3, 4, 5, 6}},
		{"an earlier process", 99, []int64{3, 4, 5, 6}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := b.Subscribe(true, tc.lastID)
			defer s.Close()
			var got []int64
			for range tc.want {
				got = append(got, next(t, s).Seq)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("replayed %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("replayed %v, want %v", got, tc.want)
				}
			}
			// Nothing more was replayed: the next event is a live one.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if e, err := s.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("after the replay got %+v, %v; want nothing", e, err)
			}
		})
	}
}

// A subscriber that does not read is dropped once its buffer is full, and Publish never
// blocks on it; what it had buffered is still delivered before its end.
func TestSlowSubscriberIsDropped(t *testing.T) {
	t.Parallel()
	b := New(Options{Buffer: 2})
	slow := b.Subscribe(false, 0)
	fast := b.Subscribe(false, 0)
	for i := 0; i < 5; i++ {
		b.Publish(sandboxEvent("a"))
		if got := next(t, fast).Seq; got != int64(i+1) {
			t.Fatalf("fast subscriber got seq %d, want %d", got, i+1)
		}
	}
	if got := next(t, slow).Seq; got != 1 {
		t.Fatalf("slow subscriber's first event: seq %d", got)
	}
	if got := next(t, slow).Seq; got != 2 {
		t.Fatalf("slow subscriber's second event: seq %d", got)
	}
	if _, err := slow.Next(context.Background()); !errors.Is(err, ErrDropped) {
		t.Fatalf("slow subscriber after its buffer: %v, want ErrDropped", err)
	}
	// Reconnecting with the last id it saw catches it up from the ring.
	again := b.Subscribe(true, 2)
	defer again.Close()
	for want := int64(3); want <= 5; want++ {
		if got := next(t, again).Seq; got != want {
			t.Fatalf("catching up: seq %d, want %d", got, want)
		}
	}
}

func TestCloseEndsSubscriptions(t *testing.T) {
	t.Parallel()
	b := New(Options{})
	s := b.Subscribe(false, 0)
	done := make(chan error, 1)
	go func() {
		_, err := s.Next(context.Background())
		done <- err
	}()
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Next after Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Next did not return after Close")
	}
	if _, err := b.Subscribe(false, 0).Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("subscribing to a closed bus: %v, want ErrClosed", err)
	}
	b.Publish(sandboxEvent("a")) // must not panic or block
}

// BenchmarkPublish publishes to 8 subscribers that read as fast as they can; drops/op says
// how often one fell a whole buffer behind (and would have reconnected).
func BenchmarkPublish(b *testing.B) {
	bus := New(Options{})
	var drops atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		s := bus.Subscribe(false, 0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := s.Next(context.Background()); err != nil {
					if errors.Is(err, ErrDropped) {
						drops.Add(1)
					}
					return
				}
			}
		}()
	}
	b.ReportAllocs()
	for b.Loop() {
		bus.Publish(sandboxEvent("a"))
	}
	bus.Close()
	wg.Wait()
	b.ReportMetric(float64(drops.Load())/float64(b.N), "drops/op")
}

// TestOnPublish: the hook is handed each event numbered and stamped, in the order of the
// numbers, before a subscriber can see it (the webhooks' outbox records it there).
func TestOnPublish(t *testing.T) {
	t.Parallel()
	var b *Bus
	var got []int64
	var seenBySub []bool
	var s *Subscription
	b = New(Options{OnPublish: func(e openapi.Event) {
		got = append(got, e.Seq)
		if e.At.IsZero() {
			t.Errorf("event %d handed over unstamped", e.Seq)
		}
		// The subscriber's buffer does not hold it yet.
		seenBySub = append(seenBySub, len(s.c) > 0)
	}})
	s = b.Subscribe(false, 0)
	defer s.Close()
	for range 3 {
		b.Publish(sandboxEvent("a"))
		next(t, s)
	}
	if len(got) != 3 || got[0] != 1 || got[2] != 3 || seenBySub[0] || seenBySub[1] || seenBySub[2] {
		t.Fatalf("OnPublish saw %v (subscriber ahead: %v)", got, seenBySub)
	}
}
