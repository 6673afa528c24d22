package store

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

// declareAll declares the names the other components of bothyd declare.
func declareAll(t testing.TB, s *Store) {
	t.Helper()
	for _, name := range []string{"exec.lock", "clone.json", "control.capability", "sandbox.log"} {
		if err := s.Declare(name, EntryFile); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"control", "upper", "work", "rootfs"} {
		if err := s.Declare(name, EntryDir); err != nil {
			t.Fatal(err)
		}
	}
}

func openStore(t testing.TB, root string) *Store {
	t.Helper()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	declareAll(t, s)
	t.Cleanup(func() { s.Close() })
	return s
}

func newStore(t testing.TB) *Store { return openStore(t, t.TempDir()) }

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func config(id string) *Config {
	return &Config{ID: id, Image: "host", Resources: Resources{VCPUs: 1, MemoryMB: 256, Pids: 64},
		Labels: map[string]string{"team": "a"}, CreatedAt: time.Unix(1700000000, 0).UTC()}
}

// provision makes a provisioned sandbox id.
func provision(t testing.TB, s *Store, id string) {
	t.Helper()
	l, err := s.LockForProvision(timeout(t, 5*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if err := l.RequireUnprovisioned(); err != nil {
		t.Fatal(err)
	}
	if err := l.WriteConfig(config(id)); err != nil {
		t.Fatal(err)
	}
}

func lockExisting(t testing.TB, s *Store, id string) *Lock {
	t.Helper()
	l, err := s.LockExisting(timeout(t, 5*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Unlock() })
	return l
}

func entriesOf(t testing.TB, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func wantCode(t testing.TB, err error, code errcode.Code) {
	t.Helper()
	if !errors.Is(err, code) {
		t.Fatalf("error = %v; want %s", err, code)
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func TestOpen(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "a", "state")
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Root() != root {
		t.Fatalf("Root() = %q; want %q", s.Root(), root)
	}
	for _, p := range []string{root, filepath.Join(root, SandboxesDir)} {
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v, %v; want a 0700 directory", p, fi, err)
		}
	}
	// Opening again finds what the first Open made.
	s2, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
}

func TestOpenRefusesLinks(t *testing.T) {
	t.Parallel()
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "root")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(link); err == nil {
		s.Close()
		t.Fatal("Open accepted a root that is a link")
	}
	if entries := entriesOf(t, real); len(entries) != 0 {
		t.Fatalf("Open created %v through the link", entries)
	}

	root := t.TempDir()
	if err := os.Symlink(real, filepath.Join(root, SandboxesDir)); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(root); err == nil {
		s.Close()
		t.Fatal("Open accepted a sandboxes directory that is a link")
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	for _, id := range []string{"b", "a", "c-1"} {
		provision(t, s, id)
	}
	sbx := filepath.Join(s.Root(), SandboxesDir)
	// Invalid names, non-directories and links are not sandboxes.
	if err := os.Mkdir(filepath.Join(sbx, "Bad_Name"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sbx, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(sbx, "a"), filepath.Join(sbx, "link")); err != nil {
		t.Fatal(err)
	}
	ids, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c-1"}; !slices.Equal(ids, want) {
		t.Fatalf("List() = %v; want %v", ids, want)
	}
}

func TestDirValidatesID(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	if _, err := s.Dir("../x"); errcode.Of(err) != errcode.InvalidRequest {
		t.Fatalf("Dir(../x) = %v", err)
	}
	ctx := timeout(t, time.Second)
	for _, id := range []string{"..", "a/b", ""} {
		if _, err := s.LockForProvision(ctx, id); errcode.Of(err) != errcode.InvalidRequest {
			t.Fatalf("LockForProvision(%q) = %v; want invalid-request", id, err)
		}
		if _, err := s.LockExisting(ctx, id); errcode.Of(err) != errcode.InvalidRequest {
			t.Fatalf("LockExisting(%q) = %v; want invalid-request", id, err)
		}
		if _, err := s.ReadConfigUnlocked(id); errcode.Of(err) != errcode.InvalidRequest {
			t.Fatalf("ReadConfigUnlocked(%q) = %v; want invalid-request", id, err)
		}
	}
	if entries := entriesOf(t, filepath.Join(s.Root(), SandboxesDir)); len(entries) != 0 {
		t.Fatalf("invalid ids made %v", entries)
	}
	if _, err := os.Lstat(filepath.Join(s.Root(), "x")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("an invalid id touched the root")
	}
}
