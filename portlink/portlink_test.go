package portlink

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

func TestLinkLifecycle(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Unix(1000, 0).UTC()
	l, tok, err := s.Create("demo", created, 8000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.ExpiresAt.Sub(l.CreatedAt); got != DefaultTTL {
		t.Errorf("default ttl %s", got)
	}
	if got, err := s.Resolve(tok); err != nil || got.ID != l.ID || got.Port != 8000 {
		t.Fatalf("resolve: %+v %v", got, err)
	}
	fi, err := os.Stat(filepath.Join(root, KeyName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}

	cases := map[string]string{
		"no signature":    l.ID,
		"wrong signature": l.ID + ".AAAA",
		"other id":        strings.Repeat("0", 32) + tok[32:],
		"flipped byte":    tok[:len(tok)-1] + flipLast(tok),
		"empty":           "",
	}
	for name, bad := range cases {
		if _, err := s.Resolve(bad); !errors.Is(err, errcode.LinkNotFound) {
			t.Errorf("%s: %v, want link-not-found", name, err)
		}
	}

	// A restart keeps the link; a revocation holds across a restart too.
	s2, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Resolve(tok); err != nil {
		t.Fatalf("after a reopen: %v", err)
	}
	if err := s2.Revoke("demo", 8000, l.ID); err != nil {
		t.Fatal(err)
	}
	if err := s2.Revoke("demo", 8000, l.ID); !errors.Is(err, errcode.LinkNotFound) {
		t.Fatalf("revoking twice: %v", err)
	}
	s3, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s3.Resolve(tok); !errors.Is(err, errcode.LinkNotFound) {
		t.Fatalf("a revoked link after a reopen: %v", err)
	}
}

func TestLinkExpires(t *testing.T) {
	t.Parallel()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(5000, 0)
	s.now = func() time.Time { return now }
	_, tok, err := s.Create("demo", now, 80, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(9 * time.Second)
	if _, err := s.Resolve(tok); err != nil {
		t.Fatalf("before expiry: %v", err)
	}
	now = now.Add(time.Second)
	if _, err := s.Resolve(tok); !errors.Is(err, errcode.LinkNotFound) {
		t.Fatalf("at expiry: %v", err)
	}
	for _, ttl := range []time.Duration{time.Millisecond, MaxTTL + time.Second} {
		if _, _, err := s.Create("demo", now, 80, ttl); !errors.Is(err, errcode.InvalidRequest) {
			t.Errorf("ttl %s: %v, want invalid-request", ttl, err)
		}
	}
}

func TestLinkRefusesAKeyOthersCanRead(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if _, err := Open(root); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, KeyName), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(root); err == nil {
		t.Fatal("a key readable by others was accepted")
	}
}

// flipLast is tok with its last character changed to another of the signature's alphabet.
func flipLast(tok string) string {
	last := tok[len(tok)-1]
	other := byte('A')
	if last == 'A' {
		other = 'B'
	}
	return tok[:len(tok)-1] + string(other)
}

// TestLinkList: a list holds the live links of the one sandbox (not an earlier one of the
// same id), of the port asked for (or all), oldest first, and forgets expired ones.
func TestLinkList(t *testing.T) {
	t.Parallel()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(5000, 0).UTC()
	s.now = func() time.Time { return now }
	born, reborn := time.Unix(10, 0).UTC(), time.Unix(20, 0).UTC()
	mk := func(sandbox string, created time.Time, port int, ttl time.Duration) Link {
		t.Helper()
		l, _, err := s.Create(sandbox, created, port, ttl)
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
		return l
	}
	old := mk("demo", born, 80, time.Hour)
	a := mk("demo", reborn, 80, time.Hour)
	short := mk("demo", reborn, 81, 10*time.Second)
	b := mk("demo", reborn, 81, time.Hour)
	other := mk("other", reborn, 80, time.Hour)
	ids := func(ls []Link) string {
		var out []string
		for _, l := range ls {
			out = append(out, l.ID)
		}
		return strings.Join(out, ",")
	}
	cases := []struct {
		name string
		port int
		want []Link
	}{
		{"every port", 0, []Link{a, short, b}},
		{"port 80", 80, []Link{a}},
		{"port 81", 81, []Link{short, b}},
		{"no links", 82, nil},
	}
	for _, c := range cases {
		if got := ids(s.List("demo", reborn, c.port)); got != ids(c.want) {
			t.Errorf("%s: %s, want %s", c.name, got, ids(c.want))
		}
	}
	if got := ids(s.List("demo", born, 0)); got != old.ID {
		t.Errorf("the earlier sandbox's: %s, want %s", got, old.ID)
	}
	if got := ids(s.List("other", reborn, 0)); got != other.ID {
		t.Errorf("other: %s", got)
	}
	now = now.Add(time.Minute)
	if got := ids(s.List("demo", reborn, 81)); got != b.ID {
		t.Errorf("after the short one expired: %s, want %s", got, b.ID)
	}
}

// TestLinkNodeTag: a node's links begin with its tag, which TokenTag reads back; the tag is
// signed with the rest, so a token moved to another node's tag resolves nowhere.
func TestLinkNodeTag(t *testing.T) {
	t.Parallel()
	s, err := OpenNode(t.TempDir(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if NodeTag("node-a") == NodeTag("node-b") || len(NodeTag("node-a")) != TagLen {
		t.Fatalf("tags %q %q", NodeTag("node-a"), NodeTag("node-b"))
	}
	seen := map[string]bool{}
	for range 20 {
		l, tok, err := s.Create("demo", time.Unix(1, 0), 80, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.ID) != IDLen || !strings.HasPrefix(l.ID, NodeTag("node-a")) || seen[l.ID] {
			t.Fatalf("id %q", l.ID)
		}
		seen[l.ID] = true
		if tag, ok := TokenTag(tok); !ok || tag != NodeTag("node-a") {
			t.Fatalf("TokenTag(%q) = %q %v", tok, tag, ok)
		}
		if _, err := s.Resolve(tok); err != nil {
			t.Fatal(err)
		}
		moved := NodeTag("node-b") + tok[TagLen:]
		if _, err := s.Resolve(moved); !errors.Is(err, errcode.LinkNotFound) {
			t.Fatalf("a token with another node's tag: %v", err)
		}
	}
	for _, bad := range []string{"", "abc", strings.Repeat("g", 32) + ".x", strings.Repeat("a", 31) + ".x", strings.Repeat("A", 32) + ".x"} {
		if _, ok := TokenTag(bad); ok {
			t.Errorf("TokenTag(%q) ok", bad)
		}
	}
	// Outside a cluster the id is random throughout.
	plain, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := plain.Create("demo", time.Unix(1, 0), 80, 0)
	if err != nil || len(l.ID) != IDLen || strings.HasPrefix(l.ID, NodeTag("")) {
		t.Fatalf("plain id %q %v", l.ID, err)
	}
}
