package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// populate fills a provisioned sandbox's directory with everything a launched-and-stopped
// sandbox has: declared files and directories (with content), an outcome, temp leftovers.
func populate(t *testing.T, dir string) {
	t.Helper()
	for _, name := range []string{"exec.lock", "clone.json", "control.capability", "sandbox.log", OutcomeName,
		platform.TempName(ConfigName), platform.TempName(OutcomeName), platform.TempName("clone.json")} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"upper/usr/lib", "work/work", "control", "rootfs"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "upper/usr/lib/f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The overlay work directory is mode 000; removal must cope.
	if err := os.Chmod(filepath.Join(dir, "work/work"), 0); err != nil {
		t.Fatal(err)
	}
}

func TestDeprovisionRemovesEverything(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	populate(t, l.Dir())
	moved := entriesOf(t, l.Dir())
	moved = slices.DeleteFunc(moved, func(n string) bool { return n == LockName || n == ConfigName })
	if err := l.Deprovision(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if exists(l.Dir()) {
		t.Fatalf("directory left: %v", entriesOf(t, l.Dir()))
	}
	if err := l.Unlock(); err != nil {
		t.Fatalf("Unlock after Deprovision = %v; want nil", err)
	}
	_, err := s.ReadConfigUnlocked("a")
	wantCode(t, err, errcode.SandboxNotFound)
	// The id is free again.
	provision(t, s, "a")

	// What the removal took out is in one bin of the trash, until the trash is emptied.
	select {
	case <-s.Trashed():
	default:
		t.Fatal("the removal moved entries into the trash without a signal")
	}
	bins, err := s.TrashBins()
	if err != nil || len(bins) != 1 || !strings.HasPrefix(bins[0], "a.") {
		t.Fatalf("TrashBins = %v, %v; want one bin of a", bins, err)
	}
	if got := entriesOf(t, filepath.Join(s.Root(), TrashDir, bins[0])); !slices.Equal(got, moved) {
		t.Fatalf("the bin holds %v; want what the state directory held, %v", got, moved)
	}
	if n, err := s.EmptyTrash(); n != 1 || err != nil {
		t.Fatalf("EmptyTrash = %d, %v; want 1, nil", n, err)
	}
	if got := entriesOf(t, filepath.Join(s.Root(), TrashDir)); len(got) != 0 {
		t.Fatalf("the trash holds %v after EmptyTrash", got)
	}
}

func TestDeprovisionNeedsConfig(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	l, err := s.LockForProvision(timeout(t, time.Second), "a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	populate(t, l.Dir())
	before := entriesOf(t, l.Dir())
	wantCode(t, l.Deprovision(timeout(t, time.Second)), errcode.SandboxNotFound)
	if after := entriesOf(t, l.Dir()); !slices.Equal(before, after) {
		t.Fatalf("entries changed from %v to %v", before, after)
	}
}

func TestDeprovisionRefusesLaunched(t *testing.T) {
	t.Parallel()
	for _, name := range []string{RuntimeName, LaunchName} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			provision(t, s, "a")
			l := lockExisting(t, s, "a")
			populate(t, l.Dir())
			if err := os.WriteFile(filepath.Join(l.Dir(), name), []byte(`{"format":1}`), 0o600); err != nil {
				t.Fatal(err)
			}
			before := entriesOf(t, l.Dir())
			wantCode(t, l.Deprovision(timeout(t, time.Second)), errcode.SandboxLaunched)
			if after := entriesOf(t, l.Dir()); !slices.Equal(before, after) {
				t.Fatalf("entries changed from %v to %v", before, after)
			}
		})
	}
}

func TestDeprovisionForeignFiles(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	populate(t, l.Dir())
	if err := os.Remove(filepath.Join(l.Dir(), "sandbox.log")); err != nil {
		t.Fatal(err)
	}
	foreign := []string{
		".notes.0123456789abcdef.tmp", // the temp form of an undeclared name
		"Upper",                       // declared names match exactly
		"data",
		"notes.txt",
		"sandbox.log", // a directory where a file was declared
	}
	for _, name := range foreign {
		var err error
		if name == "data" || name == "sandbox.log" {
			err = os.Mkdir(filepath.Join(l.Dir(), name), 0o700)
		} else {
			err = os.WriteFile(filepath.Join(l.Dir(), name), nil, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	err := l.Deprovision(timeout(t, time.Second))
	wantCode(t, err, errcode.ForeignFiles)
	var fe *ForeignFilesError
	if !errors.As(err, &fe) || !slices.Equal(fe.Entries, foreign) {
		t.Fatalf("Deprovision = %v; want foreign-files naming %v", err, foreign)
	}
	// The sandbox is removed; the foreign entries and the directory are kept.
	want := append([]string{LockName}, foreign...)
	slices.Sort(want)
	if got := entriesOf(t, l.Dir()); !slices.Equal(got, want) {
		t.Fatalf("directory holds %v", got)
	}
	l.Unlock()
	if got := entriesOf(t, l.Dir()); !slices.Equal(got, foreign) {
		t.Fatalf("after Unlock the directory holds %v; want only the foreign entries", got)
	}
	_, err = s.LockExisting(timeout(t, time.Second), "a")
	wantCode(t, err, errcode.SandboxNotFound)
}

func TestDeprovisionDoesNotFollowLinks(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	outside := t.TempDir()
	precious := filepath.Join(outside, "precious")
	if err := os.WriteFile(precious, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(l.Dir(), "upper"), 0o700); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"upper/escape":       outside, // a link inside a declared directory
		"upper/file":         precious,
		"work":               outside, // a declared directory that is a link
		"clone.json":         precious,
		"sandbox.log":        precious, // a declared file that is a link
		OutcomeName:          precious,
		"rootfs":             "/",
		"control":            "../../..",
		"exec.lock":          "/nonexistent",
		"control.capability": outside,
	} {
		if err := os.Symlink(target, filepath.Join(l.Dir(), link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Deprovision(timeout(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if exists(l.Dir()) {
		t.Fatal("directory left")
	}
	// The links went to the trash; emptying it removes them, never what they point to.
	if _, err := s.EmptyTrash(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(precious); err != nil || string(got) != "keep" {
		t.Fatalf("a file reached through a link was changed: %q, %v", got, err)
	}
	if got := entriesOf(t, outside); !slices.Equal(got, []string{"precious"}) {
		t.Fatalf("outside directory holds %v", got)
	}
	if got := entriesOf(t, filepath.Join(s.Root(), TrashDir)); len(got) != 0 {
		t.Fatalf("the trash holds %v after EmptyTrash", got)
	}
}

func TestDeprovisionWaitsForNFSFiles(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	populate(t, l.Dir())
	// Stands for a removed lock file that a waiter still holds open on NFS.
	nfs := filepath.Join(l.Dir(), ".nfs0000000000abcd00000001")
	if err := os.WriteFile(nfs, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Deprovision(timeout(t, 10*time.Second)) }()
	waitFor(t, func() bool {
		got := entriesOf(t, l.Dir())
		return len(got) == 1 && got[0] == filepath.Base(nfs)
	})
	select {
	case err := <-done:
		t.Fatalf("Deprovision returned %v while the directory was not empty", err)
	default:
	}
	// While the removal waits, the lock is free: another transition can proceed.
	_, err := s.LockExisting(timeout(t, time.Second), "a")
	wantCode(t, err, errcode.SandboxNotFound)
	if err := os.Remove(nfs); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Deprovision = %v; want success once the directory emptied", err)
	}
	if exists(l.Dir()) {
		t.Fatal("directory left")
	}
}

func TestDeprovisionProvisionedAgain(t *testing.T) {
	t.Parallel()
	// The new sandbox's provision may still hold the lock when the removal looks again, or
	// may have released it.
	for _, held := range []bool{true, false} {
		t.Run(map[bool]string{true: "held", false: "released"}[held], func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			provision(t, s, "a")
			l := lockExisting(t, s, "a")
			nfs := filepath.Join(l.Dir(), ".nfs0000000000abcd00000002")
			if err := os.WriteFile(nfs, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- l.Deprovision(timeout(t, 10*time.Second)) }()
			waitFor(t, func() bool { return !exists(filepath.Join(l.Dir(), LockName)) })
			s2 := openStore(t, s.Root())
			p, err := s2.LockForProvision(timeout(t, 5*time.Second), "a")
			if err != nil {
				t.Fatal(err)
			}
			if err := p.RequireUnprovisioned(); err != nil {
				t.Fatal(err)
			}
			c := config("a")
			c.Image = "new"
			if err := p.WriteConfig(c); err != nil {
				t.Fatal(err)
			}
			if !held {
				p.Unlock()
			}
			wantCode(t, <-done, errcode.ProvisionedAgain)
			if held {
				p.Unlock()
			}
			got, err := s.ReadConfigUnlocked("a")
			if err != nil || got.Image != "new" {
				t.Fatalf("the new sandbox was touched: %+v, %v", got, err)
			}
			if !exists(filepath.Join(l.Dir(), LockName)) {
				t.Fatal("the new sandbox lost its lock file")
			}
		})
	}
}

func TestDeprovisionWaitEndsAtDeadline(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	nfs := ".nfs0000000000abcd00000003"
	if err := os.WriteFile(filepath.Join(l.Dir(), nfs), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wantCode(t, l.Deprovision(timeout(t, 150*time.Millisecond)), errcode.TransitionInProgress)
	// The sandbox is gone, and no lock file stays in its directory.
	if got := entriesOf(t, l.Dir()); !slices.Equal(got, []string{nfs}) {
		t.Fatalf("directory holds %v; want only %s", got, nfs)
	}
	_, err := s.LockExisting(timeout(t, time.Second), "a")
	wantCode(t, err, errcode.SandboxNotFound)
}

func TestDeprovisionSucceedsWhenTheNameMovesOn(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"removed", "made again"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			provision(t, s, "a")
			l := lockExisting(t, s, "a")
			nfs := filepath.Join(l.Dir(), ".nfs0000000000abcd00000004")
			if err := os.WriteFile(nfs, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- l.Deprovision(timeout(t, 10*time.Second)) }()
			waitFor(t, func() bool { return !exists(filepath.Join(l.Dir(), LockName)) })
			// Another removal finishes the directory (here: moves it out of the way), and
			// perhaps a new one is made at the name.
			if err := os.Rename(l.Dir(), filepath.Join(t.TempDir(), "old")); err != nil {
				t.Fatal(err)
			}
			if how == "made again" {
				if err := os.Mkdir(l.Dir(), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(l.Dir(), ConfigName), []byte(`{"format":1,"id":"a"}`), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("Deprovision = %v; want success", err)
			}
			if how == "made again" && !exists(filepath.Join(l.Dir(), ConfigName)) {
				t.Fatal("the new directory was touched")
			}
		})
	}
}

func TestDeprovisionClearsAStaleLockFileWhileWaiting(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	nfs := filepath.Join(l.Dir(), ".nfs0000000000abcd00000005")
	if err := os.WriteFile(nfs, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Deprovision(timeout(t, 10*time.Second)) }()
	waitFor(t, func() bool { return !exists(filepath.Join(l.Dir(), LockName)) })
	// A waiter created a lock file in the removed sandbox and died before unlocking.
	if err := os.WriteFile(filepath.Join(l.Dir(), LockName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !exists(filepath.Join(l.Dir(), LockName)) })
	if err := os.Remove(nfs); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Deprovision = %v; want success", err)
	}
	if exists(l.Dir()) {
		t.Fatal("directory left")
	}
}

// waitFor waits for cond, polling, and fails the test if it does not hold within 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
