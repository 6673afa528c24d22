package perkey

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func TestOneLinePerKeyAndPeriod(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := New(slog.New(slog.NewJSONHandler(&buf, nil)), time.Hour, 16)
	for range 1000 {
		l.Warn("a", "flood", "sandbox", "a")
	}
	l.Warn("b", "flood", "sandbox", "b")
	got := lines(t, &buf)
	if len(got) != 2 || got[0]["sandbox"] != "a" || got[1]["sandbox"] != "b" {
		t.Fatalf("logged %v; want one line for a and one for b", got)
	}
	// Once the period has passed, the next line says how many were dropped.
	l.keys["a"].last = time.Now().Add(-time.Hour)
	l.Warn("a", "flood", "sandbox", "a")
	got = lines(t, &buf)
	if len(got) != 3 || got[2]["suppressed"] != float64(999) {
		t.Fatalf("logged %v; want a third line with suppressed 999", got)
	}
}

func TestKeysAreBounded(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := New(slog.New(slog.NewJSONHandler(&buf, nil)), time.Hour, 8)
	for i := range 100 {
		l.Warn(strings.Repeat("k", i+1), "flood")
	}
	if got := len(lines(t, &buf)); got != 8 {
		t.Fatalf("logged %d lines under 100 new keys; want 8, the bound", got)
	}
	if len(l.keys) != 8 || l.Dropped() != 92 {
		t.Fatalf("%d keys kept and %d lines dropped; want 8 and 92", len(l.keys), l.Dropped())
	}
	// Keys whose period has passed make room.
	for _, st := range l.keys {
		st.last = time.Now().Add(-time.Hour)
	}
	l.Warn("new", "flood")
	if got := len(lines(t, &buf)); got != 9 {
		t.Fatalf("logged %d lines; want the new key's line once old keys lapsed", got)
	}
}

func TestDisabledLevelCostsNothing(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := New(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})), time.Hour, 8)
	l.Warn("a", "quiet")
	if buf.Len() != 0 || len(l.keys) != 0 {
		t.Fatalf("a disabled level logged %q and kept %d keys", buf.String(), len(l.keys))
	}
}
