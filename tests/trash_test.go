package tests

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/bothy/bothy/store"
)

// TestTrash checks that a delete answers with its sandbox gone and moves what its state
// directory held into the trash, which the server then empties; that what a crash leaves in
// the trash is reported by bothyd check (a note, not a problem), removed by check --repair
// and by the server's start-up, and that emptying it never follows a link out of it.
func TestTrash(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t)
	trash := filepath.Join(d.Root, store.TrashDir)
	trashBins := func() []string {
		t.Helper()
		es, err := os.ReadDir(trash)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}

	t.Run("a delete moves the sandbox out and the server frees it", func(t *testing.T) {
		d := d.in(t)
		decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "gone", "start": true}), 201)
		d.execTrue("gone")
		d.mustStatus(200, "POST", "/v1/sandboxes/gone/stop?force=true", nil)
		if _, err := os.Stat(filepath.Join(d.Root, store.SandboxesDir, "gone", "disk.img")); err != nil {
			t.Fatalf("the stopped sandbox has no disk image to move: %v", err)
		}
		d.mustStatus(204, "DELETE", "/v1/sandboxes/gone", nil)
		if _, err := os.Lstat(filepath.Join(d.Root, store.SandboxesDir, "gone")); !os.IsNotExist(err) {
			t.Fatalf("the deleted sandbox's state directory is still there after the delete answered: %v", err)
		}
		waitFor(t, 30*time.Second, "the server to empty the trash", func() bool { return len(trashBins()) == 0 })
		// The id is free at once.
		decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "gone"}), 201)
		d.mustStatus(204, "DELETE", "/v1/sandboxes/gone", nil)
	})

	// A bin as a crash between a delete and the janitor leaves it, with a link to something
	// outside the state root among its entries.
	outside := t.TempDir()
	precious := filepath.Join(outside, "precious")
	if err := os.WriteFile(precious, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	leaveBin := func(name string) {
		t.Helper()
		bin := filepath.Join(trash, name)
		for _, dir := range []string{"upper/usr/lib", "work/work"} {
			if err := os.MkdirAll(filepath.Join(bin, dir), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(bin, "disk.img"), make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		for link, target := range map[string]string{"upper/escape": outside, "upper/usr/lib/f": precious, "sandbox.log": precious} {
			if err := os.Symlink(target, filepath.Join(bin, link)); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantPreciousKept := func(when string) {
		t.Helper()
		if got, err := os.ReadFile(precious); err != nil || string(got) != "keep" {
			t.Fatalf("%s: a file a link in the trash points to was changed: %q, %v", when, got, err)
		}
		if es, _ := os.ReadDir(outside); len(es) != 1 {
			t.Fatalf("%s: the directory a link in the trash points to holds %d entries, want 1", when, len(es))
		}
	}

	t.Run("check reports a crash's leftovers and repair frees them", func(t *testing.T) {
		d.Kill()
		leaveBin("crashed.0123456789abcdef")
		r := mustCheckClean(t, d.Root, "with a bin left in the trash")
		if r.Trash != 1 || !slices.ContainsFunc(r.Notes, func(n checkProblem) bool { return n.Kind == "trash" && n.Entry == store.TrashDir }) {
			t.Fatalf("check with a bin in the trash: trash %d, notes %v; want 1 and a trash note", r.Trash, r.Notes)
		}
		r, code, stderr := runCheck(t, d.Root, "--repair")
		if code != 0 || !r.OK || r.Trash != 0 {
			t.Fatalf("check --repair exited %d (%s): trash %d, ok %v; want the trash emptied", code, stderr, r.Trash, r.OK)
		}
		if bins := trashBins(); len(bins) != 0 {
			t.Fatalf("the trash holds %v after check --repair", bins)
		}
		wantPreciousKept("after check --repair")
	})

	t.Run("the server's start-up frees a crash's leftovers", func(t *testing.T) {
		leaveBin("crashed.fedcba9876543210")
		d.start()
		waitFor(t, 30*time.Second, "the restarted server to empty the trash", func() bool { return len(trashBins()) == 0 })
		wantPreciousKept("after the server's start-up")
		mustCheckClean(t, d.Root, "after the server emptied the trash")
	})
}
