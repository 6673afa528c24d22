// Package ratelog bounds the log lines that others can cause: a slog.Handler that lets
// through a burst of records of one message and then a steady rate, drops the rest, and says
// on the next record it lets through how many it dropped. Whatever a remote client (or a
// sandbox) does, the log grows at a bounded rate, and a flood is still visible in it.
//
// Records are grouped by level and message, which in bothyd are constant strings; the
// number of groups kept is bounded too, past which records share one group. [Keyed] is the
// other way: a logger that gives each key (a sandbox and what it did) its own allowance, for
// lines whose rate one sandbox chooses.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of [New].
const (
	DefaultBurst = 200
	DefaultRate  = 100 // records a second, per message
	// maxKeys bounds the messages tracked apart.
	maxKeys = 1024
)

// Handler is the rate-limited handler. Its zero value is not usable; use [New].
type Handler struct {
	next  slog.Handler
	state *state
}

type state struct {
	burst, rate float64
	now         func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens  float64
	last    time.Time
	dropped int
}

// New wraps next: each message may log burst records at once and rate a second after.
// Zero or negative values take the defaults.
func New(next slog.Handler, burst, rate int) *Handler {
	if burst <= 0 {
		burst = DefaultBurst
	}
	if rate <= 0 {
		rate = DefaultRate
	}
	return &Handler{next: next, state: &state{burst: float64(burst), rate: float64(rate), now: time.Now, buckets: map[string]*bucket{}}}
}

// Logger is a logger whose records pass through a Handler over l's.
func Logger(l *slog.Logger) *slog.Logger { return slog.New(New(l.Handler(), 0, 0)) }

// allow takes a token of key's bucket, and says how many records were dropped before it.
func (s *state) allow(key string) (ok bool, dropped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	b := s.buckets[key]
	if b == nil {
		if len(s.buckets) >= maxKeys {
			key = ""
			b = s.buckets[key]
		}
		if b == nil {
			b = &bucket{tokens: s.burst, last: now}
			s.buckets[key] = b
		}
	}
	b.tokens = min(s.burst, b.tokens+now.Sub(b.last).Seconds()*s.rate)
	b.last = now
	if b.tokens < 1 {
		b.dropped++
		return false, 0
	}
	b.tokens--
	dropped, b.dropped = b.dropped, 0
	return true, dropped
}

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle implements slog.Handler: the record goes on if its message has a token.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	ok, dropped := h.state.allow(r.Level.String() + "\x00" + r.Message)
	if !ok {
		return nil
	}
	if dropped > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", dropped))
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs implements slog.Handler; the derived handler shares the buckets.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Handler{next: h.next.WithAttrs(attrs), state: h.state}
}

// WithGroup implements slog.Handler; the derived handler shares the buckets.
func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{next: h.next.WithGroup(name), state: h.state}
}
