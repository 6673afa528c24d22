package store

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
)

// TestEmptyTrashBesideAnotherProcess empties one trash from two stores at once, as a server
// and bothyd check --repair (or two servers) on one state root do: each bin goes, and
// neither reports the other's removals as errors.
func TestEmptyTrashBesideAnotherProcess(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	a, b := openStore(t, root), openStore(t, root)
	for i := range 20 {
		bin := filepath.Join(root, TrashDir, fmt.Sprintf("s%d.0123456789abcdef", i))
		for j := range 30 {
			dir := filepath.Join(bin, "upper", fmt.Sprintf("d%d", j))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, s := range []*Store{a, b} {
		wg.Go(func() { _, errs[i] = s.EmptyTrash() })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("EmptyTrash of store %d beside the other: %v", i, err)
		}
	}
	if got := entriesOf(t, filepath.Join(root, TrashDir)); len(got) != 0 {
		t.Fatalf("the trash holds %v after both emptied it", got)
	}
}

// TestRemovalWhoseBinVanishes has another process empty the trash just as a removal moves
// its first entry into its bin, which removes the bin: the removal must still leave no state
// directory behind, deleting in place what it could not move.
func TestRemovalWhoseBinVanishes(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	openStore(t, root) // makes the trash
	emptied := false
	_, l, _, err := removeWithHook(t, root, func(_ *Store, bin string) { emptied = os.RemoveAll(bin) == nil })
	if err != nil {
		t.Fatalf("a removal whose bin vanished: %v", err)
	}
	if !emptied {
		t.Fatal("the bin was never removed under the removal; the test is broken")
	}
	if exists(l.Dir()) {
		t.Fatalf("the removal whose bin vanished left its state directory: %v", entriesOf(t, l.Dir()))
	}
}

// TestEmptyTrashLeavesABinBeingFilled empties the trash from the same store just as a
// removal moves its first entry into its bin: the bin is left alone, and receives every
// entry.
func TestEmptyTrashLeavesABinBeingFilled(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var emptyErr error
	s, _, moved, err := removeWithHook(t, root, func(s *Store, _ string) { _, emptyErr = s.EmptyTrash() })
	if err != nil {
		t.Fatal(err)
	}
	if emptyErr != nil {
		t.Fatalf("EmptyTrash during the moves: %v", emptyErr)
	}
	bins, err := s.TrashBins()
	if err != nil || len(bins) != 1 {
		t.Fatalf("TrashBins = %v, %v; want the one bin, left alone while it was filled", bins, err)
	}
	if got := entriesOf(t, filepath.Join(root, TrashDir, bins[0])); !slices.Equal(got, moved) {
		t.Fatalf("the bin holds %v; want %v", got, moved)
	}
}

// removeWithHook removes a populated sandbox "a" of a store on root whose file system runs
// hook (once) just before the removal's first move into its bin, and returns the store, the
// removal's lock and what the state directory held but the lock and the configuration.
func removeWithHook(t *testing.T, root string, hook func(s *Store, bin string)) (*Store, *Lock, []string, error) {
	t.Helper()
	var s *Store
	var once sync.Once
	fault := func(op platform.Op, path string) error {
		if op == platform.OpRename && strings.Contains(path, string(filepath.Separator)+TrashDir+string(filepath.Separator)) {
			once.Do(func() { hook(s, filepath.Dir(path)) })
		}
		return nil
	}
	s, err := OpenWith(root, Options{FS: platform.FS{Fault: fault}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	declareAll(t, s)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	populate(t, l.Dir())
	moved := slices.DeleteFunc(entriesOf(t, l.Dir()), func(n string) bool { return n == LockName || n == ConfigName })
	err = l.Deprovision(timeout(t, 5*time.Second))
	l.Unlock()
	return s, l, moved, err
}

// TestDiscardMovesIntoTheTrash: Discard moves entries of a directory below the state
// directory into a bin of the trash (the sandbox keeps the rest), and EmptyTrash deletes
// them; an entry that is not there is not reported as left.
func TestDiscardMovesIntoTheTrash(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	s := openStore(t, root)
	l, err := s.LockForProvision(timeout(t, 5*time.Second), "d")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	sub := filepath.Join(l.Dir(), "checkpoints")
	for _, d := range []string{"trash-a/deep", "keep"} {
		if err := os.MkdirAll(filepath.Join(sub, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := platform.OpenDir(sub)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if left := l.Discard(dir, []string{"trash-a", "gone"}); len(left) != 0 {
		t.Fatalf("Discard left %v", left)
	}
	if got := entriesOf(t, sub); !slices.Equal(got, []string{"keep"}) {
		t.Fatalf("the directory holds %v after the discard, want keep alone", got)
	}
	if bins := entriesOf(t, filepath.Join(root, TrashDir)); len(bins) != 1 || !strings.HasPrefix(bins[0], "d.") {
		t.Fatalf("the trash holds %v, want one bin of d", bins)
	}
	if n, err := s.EmptyTrash(); err != nil || n != 1 {
		t.Fatalf("EmptyTrash: %d, %v", n, err)
	}
}
