package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
)

// newSandbox makes a state directory whose upper holds files.
func newSandbox(t *testing.T, files map[string]string) *Sandbox {
	t.Helper()
	s := &Sandbox{Dir: t.TempDir()}
	writeUpper(t, s, files)
	return s
}

func writeUpper(t *testing.T, s *Sandbox, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(s.Dir, UpperName, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// view is what an overlay of the sandbox's chain under its upper shows: each file's
// content, upper first (whiteouts are not used by these tests).
func view(t *testing.T, s *Sandbox) map[string]string {
	t.Helper()
	lowers, err := s.Lowers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range append([]string{filepath.Join(s.Dir, UpperName)}, lowers...) {
		_ = filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err != nil || fi.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(d, p)
			if _, ok := out[rel]; !ok {
				b, _ := os.ReadFile(p)
				out[rel] = string(b)
			}
			return nil
		})
	}
	return out
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func noHold() (func(), error) { return func() {}, nil }

func TestRotateAndRollback(t *testing.T) {
	t.Parallel()
	s := newSandbox(t, map[string]string{"home/user/a": "one"})
	c, err := s.Rotate("first", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Size != 3 || c.Mode != OpRotate || len(c.Chain) != 1 {
		t.Fatalf("checkpoint %+v: want size 3, mode rotate, one layer", c)
	}
	if _, err := os.Lstat(filepath.Join(s.Dir, UpperName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the upper is still there after a rotation: %v", err)
	}
	writeUpper(t, s, map[string]string{"home/user/a": "two", "home/user/b": "new"})
	if got := view(t, s); !equal(got, map[string]string{"home/user/a": "two", "home/user/b": "new"}) {
		t.Fatalf("view after writes: %v", got)
	}
	if _, err := s.Rollback("first"); err != nil {
		t.Fatal(err)
	}
	if got := view(t, s); !equal(got, map[string]string{"home/user/a": "one"}) {
		t.Fatalf("view after rollback: %v, want the checkpoint's files", got)
	}
	if err := s.Sweep(); err != nil {
		t.Fatal(err)
	}
	if names, _ := readNames(s.root()); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, trashPref) }) {
		t.Fatalf("sweep left the thrown-away upper: %v", names)
	}
	// A second rollback to the same point after more writes works the same.
	writeUpper(t, s, map[string]string{"x": "y"})
	if _, err := s.Rollback("first"); err != nil {
		t.Fatal(err)
	}
	if got := view(t, s); !equal(got, map[string]string{"home/user/a": "one"}) {
		t.Fatalf("view after the second rollback: %v", got)
	}
}

func TestCopyKeepsTheUpperAndHolds(t *testing.T) {
	t.Parallel()
	s := newSandbox(t, map[string]string{"f": "before"})
	held, released := false, false
	c, err := s.Copy(context.Background(), "live", Limits{}, func() (func(), error) {
		held = true
		return func() { released = true }, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !held || !released {
		t.Fatalf("the copy held %v and released %v; want both", held, released)
	}
	if c.Mode != OpCopy || c.Size != 6 {
		t.Fatalf("checkpoint %+v", c)
	}
	writeUpper(t, s, map[string]string{"f": "after"})
	if _, err := s.Rollback("live"); err != nil {
		t.Fatal(err)
	}
	if got := view(t, s); !equal(got, map[string]string{"f": "before"}) {
		t.Fatalf("view after rollback to a copy: %v", got)
	}
}

func TestBoundsAndNames(t *testing.T) {
	t.Parallel()
	s := newSandbox(t, map[string]string{"f": "0123456789"})
	cases := []struct {
		name string
		do   func() error
		want errcode.Code
	}{
		{"bad name", func() error { _, err := s.Rotate("Bad/Name", Limits{}); return err }, errcode.InvalidRequest},
		{"first", func() error { _, err := s.Rotate("a", Limits{Count: 1}); return err }, ""},
		{"same name", func() error { _, err := s.Rotate("a", Limits{Count: 5}); return err }, errcode.CheckpointExists},
		{"count", func() error { _, err := s.Rotate("b", Limits{Count: 1}); return err }, errcode.CheckpointLimit},
		{"bytes", func() error {
			writeUpper(t, s, map[string]string{"g": "0123456789"})
			_, err := s.Copy(context.Background(), "c", Limits{Bytes: 15}, noHold)
			return err
		}, errcode.CheckpointLimit},
		{"rollback unknown", func() error { _, err := s.Rollback("zz"); return err }, errcode.CheckpointNotFound},
		{"delete unknown", func() error { return s.Delete("zz") }, errcode.CheckpointNotFound},
	}
	for _, tc := range cases {
		err := tc.do()
		if errcode.Of(err) != tc.want || (tc.want == "" && err != nil) {
			t.Fatalf("%s: got %v, want code %q", tc.name, err, tc.want)
		}
	}
	// The refused copy left nothing behind.
	if p, err := s.Problems(); err != nil || len(p) != 0 {
		t.Fatalf("problems after a refused copy: %v %v", p, err)
	}
}

func TestDeleteSweepsUnnamedLayers(t *testing.T) {
	t.Parallel()
	s := newSandbox(t, map[string]string{"f": "x"})
	if _, err := s.Copy(context.Background(), "a", Limits{}, noHold); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Sweep(); err != nil {
		t.Fatal(err)
	}
	if layers, _ := readNames(filepath.Join(s.root(), layersName)); len(layers) != 0 {
		t.Fatalf("layers left after the only checkpoint was deleted: %v", layers)
	}
	// A rotated layer stays: the sandbox's own chain names it.
	if _, err := s.Rotate("b", Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Sweep(); err != nil {
		t.Fatal(err)
	}
	if got := view(t, s); got["f"] != "x" {
		t.Fatalf("the sandbox lost its files when a checkpoint of its chain was deleted: %v", got)
	}
}

type crashed struct{ step string }

// TestCrashAtEveryStep interrupts each operation at each of its steps (a panic standing in
// for the process's death; the supervisor's tests kill real processes) and checks that
// Recover leaves the files at one point or the other and nothing behind.
func TestCrashAtEveryStep(t *testing.T) {
	t.Parallel()
	type op struct {
		name   string
		steps  []string
		do     func(s *Sandbox) error
		before map[string]string // the view before the operation
		after  map[string]string // the view after it
	}
	base := map[string]string{"f": "base"}
	ops := []op{
		{"rotate", []string{"checkpoint-recorded", "checkpoint-rotated", "checkpoint-committed"},
			func(s *Sandbox) error { _, err := s.Rotate("n", Limits{}); return err }, base, base},
		{"copy", []string{"checkpoint-recorded", "checkpoint-copied", "checkpoint-committed"},
			func(s *Sandbox) error { _, err := s.Copy(context.Background(), "n", Limits{}, noHold); return err }, base, base},
		{"rollback", []string{"rollback-recorded", "rollback-discarded", "rollback-swapped", "rollback-committed"},
			func(s *Sandbox) error { _, err := s.Rollback("old"); return err }, map[string]string{"f": "base", "g": "later"}, base},
		{"delete", []string{"checkpoint-deleted"},
			func(s *Sandbox) error { return s.Delete("old") }, map[string]string{"f": "base", "g": "later"}, map[string]string{"f": "base", "g": "later"}},
	}
	for _, o := range ops {
		for _, step := range o.steps {
			t.Run(o.name+"/"+step, func(t *testing.T) {
				t.Parallel()
				s := newSandbox(t, base)
				if o.name == "rollback" || o.name == "delete" {
					if _, err := s.Copy(context.Background(), "old", Limits{}, noHold); err != nil {
						t.Fatal(err)
					}
					writeUpper(t, s, map[string]string{"g": "later"})
				}
				s.Crash = func(at string) {
					if at == step {
						panic(crashed{at})
					}
				}
				func() {
					defer func() {
						if r := recover(); r == nil {
							t.Fatalf("the operation did not reach %s", step)
						} else if _, ok := r.(crashed); !ok {
							panic(r)
						}
					}()
					_ = o.do(s)
				}()
				s.Crash = nil
				// Between the record and the commit the operation is pending: what the
				// supervisor's transitions look for before they recover (Pending).
				pending, err := s.Pending()
				if wantPending := step != "checkpoint-deleted" && !strings.HasSuffix(step, "-committed"); err != nil || pending != wantPending {
					t.Fatalf("after a crash at %s Pending = %v, %v; want %v", step, pending, err, wantPending)
				}
				if _, err := s.Recover(); err != nil {
					t.Fatal(err)
				}
				if pending, err := s.Pending(); err != nil || pending {
					t.Fatalf("after recovery Pending = %v, %v; want false", pending, err)
				}
				if err := s.Sweep(); err != nil {
					t.Fatal(err)
				}
				got := view(t, s)
				if !equal(got, o.before) && !equal(got, o.after) {
					t.Fatalf("after a crash at %s and recovery the files are %v: neither %v nor %v", step, got, o.before, o.after)
				}
				if p, err := s.Problems(); err != nil || len(p) != 0 {
					t.Fatalf("problems after recovery: %v %v", p, err)
				}
				m, err := s.Manifest()
				if err != nil || m.Pending != nil {
					t.Fatalf("manifest after recovery: %+v %v", m, err)
				}
			})
		}
	}
}

// TestChainIsBounded: rotation after rotation, the chain never passes MaxChain: the
// checkpoint that would pass it flattens the files into one layer, and every checkpoint
// still rolls back to its own files.
func TestChainIsBounded(t *testing.T) {
	t.Parallel()
	s := newSandbox(t, map[string]string{"f": "0"})
	lim := Limits{Count: 2 * MaxChain}
	for i := 1; i <= MaxChain+3; i++ {
		writeUpper(t, s, map[string]string{"f": fmt.Sprint(i), fmt.Sprintf("g%d", i): "x"})
		if _, err := s.Rotate(fmt.Sprintf("c%d", i), lim); err != nil {
			t.Fatalf("rotation %d: %v", i, err)
		}
		m, err := s.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Chain) > MaxChain {
			t.Fatalf("after rotation %d the chain holds %d layers, more than %d", i, len(m.Chain), MaxChain)
		}
		for _, c := range m.Checkpoints {
			if len(c.Chain) > MaxChain {
				t.Fatalf("checkpoint %s stands on %d layers", c.Name, len(c.Chain))
			}
		}
	}
	if got := view(t, s); got["f"] != fmt.Sprint(MaxChain+3) {
		t.Fatalf("after the flattening the sandbox reads f=%q", got["f"])
	}
	if _, err := s.Rollback("c5"); err != nil {
		t.Fatal(err)
	}
	if got := view(t, s); got["f"] != "5" || got["g5"] != "x" || got["g6"] != "" {
		t.Fatalf("rollback to c5 reads %v", got)
	}
	if err := s.Sweep(); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Problems(); err != nil || len(p) != 0 {
		t.Fatalf("problems: %v %v", p, err)
	}
}
