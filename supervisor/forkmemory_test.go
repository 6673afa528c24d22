package supervisor

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/runtime"
)

// TestAdoptForkState: the first fork's state is a copy of the snapshot's files, each later
// fork's the same files by hard links (one inode: no copy, and a hold on them that outlives
// the other forks); a fork whose shared state is gone (that fork was undone) copies again.
func TestAdoptForkState(t *testing.T) {
	t.Parallel()
	snap := t.TempDir()
	files := map[string]string{"memory.state": "the memory", "disk.qcow2": "the disk", "vm.json": "{}"}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(snap, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	state, err := os.Open(snap)
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	root := t.TempDir()
	dirOf := func(id string) string { return filepath.Join(root, id, runtime.ForkStateName) }
	ino := func(p string) (uint64, uint64) {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Ino, uint64(st.Nlink)
	}
	for _, c := range []struct {
		name, id, shared string
		wantLinks        uint64
	}{
		{"first fork copies", "f1", "", 1},
		{"second fork links the first's", "f2", dirOf("f1"), 2},
		{"third fork links too", "f3", dirOf("f1"), 3},
		{"a fork whose shared state is gone copies", "f4", dirOf("gone"), 1},
	} {
		if err := os.MkdirAll(filepath.Join(root, c.id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := adoptForkState(dirOf(c.id), state, c.shared); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !isFork(filepath.Join(root, c.id)) {
			t.Fatalf("%s: the sandbox is no fork", c.name)
		}
		for name, data := range files {
			p := filepath.Join(dirOf(c.id), name)
			got, err := os.ReadFile(p)
			if err != nil || string(got) != data {
				t.Fatalf("%s: %s reads %q, %v", c.name, name, got, err)
			}
			if _, n := ino(p); n != c.wantLinks {
				t.Errorf("%s: %s has %d links, want %d", c.name, name, n, c.wantLinks)
			}
			if c.wantLinks > 1 {
				a, _ := ino(p)
				b, _ := ino(filepath.Join(c.shared, name))
				if a != b {
					t.Errorf("%s: %s is not the shared file", c.name, name)
				}
			}
		}
	}
	if isFork(filepath.Join(root, "gone")) {
		t.Fatal("a sandbox without a fork-state is a fork")
	}
}

// TestForkRestoreRecord: a fork's restore mark reads back as a fork's, not a clone's, and its
// restore advances the guest's clock by the time since the save, never by a negative time.
func TestForkRestoreRecord(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	saved := time.Now().UTC().Add(-3 * time.Second)
	if err := writeForkRestore(dir, "src", saved); err != nil {
		t.Fatal(err)
	}
	rr, err := readRestore(dir)
	if err != nil || rr == nil || rr.Fork == nil || rr.Template != "" || rr.Fork.Source != "src" || !rr.Fork.SavedAt.Equal(saved) {
		t.Fatalf("the fork's restore mark reads %+v, %v", rr, err)
	}
	if adv := forkRestoreFor(rr).ClockAdvance; adv < 3*time.Second || adv > time.Hour {
		t.Fatalf("the clock advance of a state saved 3 s ago: %v", adv)
	}
	rr.Fork.SavedAt = time.Now().Add(time.Hour)
	if adv := forkRestoreFor(rr).ClockAdvance; adv != 0 {
		t.Fatalf("the clock advance of a state saved in the future: %v", adv)
	}
}
