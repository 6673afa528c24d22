package store

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestEmptyTrashBesideAnotherProcess empties one trash from two stores at once, as a server
// and sandboxd check --repair (or two servers) on one state root do: each bin goes, and
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
