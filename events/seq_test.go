package events

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/bothy/bothy/openapi"
)

// TestSeqSurvivesRestart: a bus opened again on the same directory numbers its events after
// every number an earlier one gave, also one that stopped in the middle of a block, and
// writes the record once per block, not once per event.
func TestSeqSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open := func() *Bus {
		t.Helper()
		b, err := Open(Options{SeqDir: dir, SeqBlock: 4, OnError: func(err error) { t.Errorf("reservation: %v", err) }})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	reserved := func() int64 {
		t.Helper()
		n, err := readSeq(dir)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	b := open()
	var last int64
	for i := range 5 {
		last = b.Publish(openapi.Event{Type: "sandbox.created"}).Seq
		if last != int64(i+1) {
			t.Fatalf("event %d numbered %d", i, last)
		}
		if i == 2 && reserved() != 4 {
			t.Fatalf("after 3 events of a block of 4: reserved %d, want 4", reserved())
		}
	}
	if reserved() != 8 {
		t.Fatalf("after 5 events: reserved %d, want 8", reserved())
	}
	b.Close()

	again := open()
	if again.Seq() < last {
		t.Fatalf("a reopened bus starts at %d, before the %d given", again.Seq(), last)
	}
	if e := again.Publish(openapi.Event{Type: "sandbox.created"}); e.Seq <= last {
		t.Fatalf("the first event after a restart is %d; %d was given before it", e.Seq, last)
	}
	// A Last-Event-ID of the earlier process replays only what this one published.
	s := again.Subscribe(true, last)
	if len(s.backlog) != 1 || s.backlog[0].Seq != 9 {
		t.Fatalf("replay after the earlier process's last id: %+v", s.backlog)
	}
	s.Close()
}

// TestSeqReservationFails: an event is published though its block cannot be reserved, the
// failure is reported, and the next event retries.
func TestSeqReservationFails(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var failures int
	b, err := Open(Options{SeqDir: dir, SeqBlock: 4, OnError: func(error) { failures++ }})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if e := b.Publish(openapi.Event{Type: "sandbox.created"}); e.Seq != 1 || failures != 1 {
		t.Fatalf("event %d, %d failures; want 1 and 1", e.Seq, failures)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b.Publish(openapi.Event{Type: "sandbox.created"})
	if n, err := readSeq(dir); err != nil || n != 5 || failures != 1 {
		t.Fatalf("after the retry: reserved %d (%v), %d failures; want 5 and 1", n, err, failures)
	}

	// An unreadable record refuses the bus: starting from 0 would reuse numbers.
	if err := os.WriteFile(filepath.Join(dir, SeqName), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{SeqDir: dir}); err == nil {
		t.Fatal("a bus opened on a record that does not decode")
	}
}
