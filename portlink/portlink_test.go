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
