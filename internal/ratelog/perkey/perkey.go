// Package perkey bounds the log lines that someone bothyd does not trust can cause: a
// sandbox's root, a remote client. Each such line is logged under a key (the sandbox's id and
// what happened, say) at most once per period; the lines dropped in between are counted, and
// the next line logged under the key says how many. The number of keys is bounded too, so
// that many keys at once (many sandboxes, or many names as keys) cannot flood the log either:
// past the bound, a line whose key is new is dropped and only counted.
//
// It must not be used for lines bothyd's own operation causes, which are few and each of
// which matters; only for those whose rate someone outside chooses.
package perkey

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Logger logs through an slog.Logger at most one line per key and period.
type Logger struct {
	log     *slog.Logger
	every   time.Duration
	maxKeys int

	mu      sync.Mutex
	keys    map[string]*state
	dropped uint64 // lines dropped because the keys were at their bound
}

// state is what a key has logged: when its last line went out, and how many lines were
// dropped since.
type state struct {
	last  time.Time
	quiet uint64
}

// New returns a Logger that logs through log at most one line per key in each period every,
// and keeps at most maxKeys keys at a time.
func New(log *slog.Logger, every time.Duration, maxKeys int) *Logger {
	return &Logger{log: log, every: every, maxKeys: max(maxKeys, 1), keys: map[string]*state{}}
}

// Warn logs msg with args at level Warn, unless a line under key went out less than a period
// ago: then it only counts the line. A line that goes out after dropped ones carries
// "suppressed", their count.
func (l *Logger) Warn(key, msg string, args ...any) { l.Log(slog.LevelWarn, key, msg, args...) }

// Log is [Logger.Warn] at any level.
func (l *Logger) Log(level slog.Level, key, msg string, args ...any) {
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	now := time.Now()
	l.mu.Lock()
	st := l.keys[key]
	if st == nil {
		if len(l.keys) >= l.maxKeys {
			l.sweep(now)
		}
		if len(l.keys) >= l.maxKeys {
			l.dropped++
			l.mu.Unlock()
			return
		}
		st = &state{}
		l.keys[key] = st
	} else if now.Sub(st.last) < l.every {
		st.quiet++
		l.mu.Unlock()
		return
	}
	quiet := st.quiet
	st.last, st.quiet = now, 0
	l.mu.Unlock()
	if quiet > 0 {
		args = append(args, "suppressed", quiet)
	}
	l.log.Log(context.Background(), level, msg, args...)
}

// sweep forgets the keys whose last line is a period old or more: their next line goes out
// anyway. What they dropped since is lost, which is the price of a bounded map.
func (l *Logger) sweep(now time.Time) {
	for k, st := range l.keys {
		if now.Sub(st.last) >= l.every {
			delete(l.keys, k)
		}
	}
}

// Dropped returns how many lines were dropped, not counted under any key, because the keys
// were at their bound.
func (l *Logger) Dropped() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}
