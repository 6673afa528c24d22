package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestFloodIsBounded: a flood of one message logs its burst, then nothing until time passes,
// then one line that says how many were dropped; another message is not held up by it.
func TestFloodIsBounded(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := New(slog.NewTextHandler(&buf, nil), 10, 1)
	now := time.Unix(1000, 0)
	h.state.now = func() time.Time { return now }
	log := slog.New(h)
	for range 1000 {
		log.Warn("query unanswered", "n", 1)
	}
	if n := strings.Count(buf.String(), "query unanswered"); n != 10 {
		t.Fatalf("a flood of 1000 logged %d lines, want the burst of 10", n)
	}
	log.Info("another message")
	if !strings.Contains(buf.String(), "another message") {
		t.Fatal("another message was held up by the flood")
	}
	now = now.Add(time.Second)
	buf.Reset()
	log.Warn("query unanswered")
	if !strings.Contains(buf.String(), "suppressed=990") {
		t.Fatalf("the line after the flood does not count what was dropped: %q", buf.String())
	}
}
