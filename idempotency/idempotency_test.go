package idempotency

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func openAt(t *testing.T, root string, c *clock, o Options) *Store {
	t.Helper()
	o.Now = c.now
	s, err := Open(root, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestReplayAcrossOpen(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	s := openAt(t, root, c, Options{})
	alice, bob := Scope("Bearer alice"), Scope("Bearer bob")
	req := RequestHash("POST", "/v1/sandboxes", []byte(`{"id":"a"}`))
	other := RequestHash("POST", "/v1/sandboxes", []byte(`{"id":"b"}`))

	if a, err := s.Begin(alice, "k1", req); a != nil || err != nil {
		t.Fatalf("a first request: %v, %v", a, err)
	}
	// While it runs: the same request waits its turn (409), another is refused (422).
	if _, err := s.Begin(alice, "k1", req); errcode.Of(err) != errcode.IdempotencyKeyInFlight {
		t.Fatalf("a repeat in flight: %v", err)
	}
	if _, err := s.Begin(alice, "k1", other); errcode.Of(err) != errcode.IdempotencyKeyReused {
		t.Fatalf("another request in flight: %v", err)
	}
	first := &Answer{Status: 201, ContentType: "application/json", Location: "/v1/sandboxes/a", Body: []byte(`{"id":"a"}`)}
	if err := s.Finish(alice, "k1", first); err != nil {
		t.Fatal(err)
	}

	// After a restart: the answer replays, another body is refused, another credential's
	// same key is a key of its own.
	s = openAt(t, root, c, Options{})
	a, err := s.Begin(alice, "k1", req)
	if err != nil || a == nil || a.Status != 201 || string(a.Body) != `{"id":"a"}` || a.Location != "/v1/sandboxes/a" {
		t.Fatalf("the replay: %+v, %v", a, err)
	}
	if _, err := s.Begin(alice, "k1", other); errcode.Of(err) != errcode.IdempotencyKeyReused {
		t.Fatalf("another body: %v", err)
	}
	if a, err := s.Begin(bob, "k1", req); a != nil || err != nil {
		t.Fatalf("another credential read the answer: %+v, %v", a, err)
	}
	_ = s.Finish(bob, "k1", nil)

	// A failed request keeps nothing: the key is free again.
	if _, err := s.Begin(alice, "k2", req); err != nil {
		t.Fatal(err)
	}
	_ = s.Finish(alice, "k2", &Answer{Status: 409})
	if a, err := s.Begin(alice, "k2", other); a != nil || err != nil {
		t.Fatalf("after a failed first: %+v, %v", a, err)
	}
	_ = s.Finish(alice, "k2", nil)

	// After the TTL the key is new, and the next start-up removes the record.
	c.t = c.t.Add(DefaultTTL)
	if a, err := s.Begin(alice, "k1", other); a != nil || err != nil {
		t.Fatalf("after the TTL: %+v, %v", a, err)
	}
	_ = s.Finish(alice, "k1", nil)
	s = openAt(t, root, c, Options{})
	if s.Len() != 0 {
		t.Fatalf("%d records after the TTL", s.Len())
	}
}

func TestBoundsAndCleaning(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	s := openAt(t, root, c, Options{MaxEntries: 3})
	scope := Scope("")
	for i, key := range []string{"a", "b", "c", "d"} {
		c.t = c.t.Add(time.Second)
		if _, err := s.Begin(scope, key, "r"); err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(scope, key, &Answer{Status: 200, Body: []byte{byte('0' + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if s.Len() != 3 {
		t.Fatalf("%d records kept, want 3", s.Len())
	}
	// The oldest went.
	if a, _ := s.Begin(scope, "a", "r"); a != nil {
		t.Fatal("the oldest answer was kept past the bound")
	}
	_ = s.Finish(scope, "a", nil)
	if a, _ := s.Begin(scope, "d", "r"); a == nil || string(a.Body) != "3" {
		t.Fatalf("the newest answer: %+v", a)
	}
	// Too large an answer is not kept.
	if _, err := s.Begin(scope, "big", "r"); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(scope, "big", &Answer{Status: 200, Body: make([]byte, MaxAnswerBytes+1)}); err != ErrNotKept {
		t.Fatalf("a large answer: %v", err)
	}
	// An interrupted write's temporary file and an unreadable record go at the start-up.
	dir := filepath.Join(root, Dir)
	tmp := filepath.Join(dir, platform.TempName(recordName(scope, "x")))
	bad := filepath.Join(dir, recordName(scope, "y"))
	for _, p := range []string{tmp, bad} {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := c.t.Add(-time.Hour)
	if err := os.Chtimes(tmp, old, old); err != nil {
		t.Fatal(err)
	}
	probs, err := Check(root, false, c.t)
	if err != nil || len(probs) != 2 || probs[0].Kind == probs[1].Kind {
		t.Fatalf("Check: %+v, %v", probs, err)
	}
	s = openAt(t, root, c, Options{MaxEntries: 3})
	if _, err := os.Lstat(tmp); !os.IsNotExist(err) {
		t.Errorf("the temporary file after the start-up: %v", err)
	}
	if _, err := os.Lstat(bad); err != nil {
		t.Errorf("the unreadable record after the start-up: %v", err)
	}
	if s.Len() != 3 {
		t.Fatalf("%d records after the start-up", s.Len())
	}
	// Past the TTL, Check's repair removes the expired records; the unreadable one stays.
	probs, err = Check(root, true, c.t.Add(DefaultTTL))
	if err != nil || len(probs) != 4 {
		t.Fatalf("Check past the TTL: %+v, %v", probs, err)
	}
	for _, p := range probs {
		if p.Repaired != (p.Kind == Leftover) {
			t.Errorf("%+v", p)
		}
	}
	if _, err := os.Lstat(bad); err != nil {
		t.Errorf("the unreadable record after a repair: %v", err)
	}
}

func TestValidKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]bool{"": false, "550e8400-e29b-41d4-a716-446655440000": true, "a\nb": false, "é": false, string(make([]byte, 256)): false} {
		if ValidKey(key) != want {
			t.Errorf("ValidKey(%q) = %v", key, !want)
		}
	}
}

// TestFinishWritesOutsideTheLock: while one answer is being written durably, another key's
// request begins and finishes, and a repeat of the key being written is told it is in flight
// (not run twice, not blocked); once written, the repeat replays. It fails on a Finish that
// writes under the store's mutex (the other key's Begin blocks until the deadline).
func TestFinishWritesOutsideTheLock(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	s := openAt(t, t.TempDir(), c, Options{})
	entered, release := make(chan struct{}), make(chan struct{})
	const scope, req = "alice", "r1"
	s.writeRecord = func(dir, name string, data []byte, perm fs.FileMode) error {
		if name == recordName(scope, "slow") {
			close(entered)
			<-release
		}
		return platform.WriteFileDurable(dir, name, data, perm)
	}
	if a, err := s.Begin(scope, "slow", req); a != nil || err != nil {
		t.Fatalf("Begin: %v %v", a, err)
	}
	finished := make(chan error, 1)
	go func() { finished <- s.Finish(scope, "slow", &Answer{Status: 201, Body: []byte("slow")}) }()
	<-entered

	other := make(chan error, 1)
	go func() {
		if _, err := s.Begin(scope, "fast", req); err != nil {
			other <- err
			return
		}
		other <- s.Finish(scope, "fast", &Answer{Status: 201, Body: []byte("fast")})
	}()
	select {
	case err := <-other:
		if err != nil {
			t.Fatalf("another key while one is written: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("another key's request waited for the durable write of the first")
	}
	if _, err := s.Begin(scope, "slow", req); errcode.Of(err) != errcode.IdempotencyKeyInFlight {
		t.Fatalf("a repeat during the write: %v, want %s", err, errcode.IdempotencyKeyInFlight)
	}
	close(release)
	if err := <-finished; err != nil {
		t.Fatal(err)
	}
	if a, err := s.Begin(scope, "slow", req); err != nil || a == nil || string(a.Body) != "slow" {
		t.Fatalf("the repeat after the write: %v %v, want the kept answer", a, err)
	}
	if s.Len() != 2 {
		t.Fatalf("%d answers kept, want 2", s.Len())
	}
}
