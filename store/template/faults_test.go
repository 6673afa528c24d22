package template

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// injector is a platform.FS fault that, once armed, counts the changing operations and fails
// the at-th of them (sticky: that one and every one after it) with errno. Armed with at 0 it
// only counts, which is how a test learns how many steps a transaction has.
type injector struct {
	mu     sync.Mutex
	armed  bool
	at     int
	sticky bool
	errno  error
	ops    []string
}

func (in *injector) fault(op platform.Op, path string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.armed {
		return nil
	}
	in.ops = append(in.ops, fmt.Sprintf("%s %s", op, filepath.Base(path)))
	n := len(in.ops)
	if in.at > 0 && (n == in.at || in.sticky && n > in.at) {
		return in.errno
	}
	return nil
}

func (in *injector) arm(at int, sticky bool, errno error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.armed, in.at, in.sticky, in.errno, in.ops = true, at, sticky, errno, nil
}

func (in *injector) disarm() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.armed = false
	return in.ops
}

// faultMode is how an injected fault behaves: a full disk that fails one step (and lets the
// undo run), or a file system that turns read-only at a step and fails everything after it.
type faultMode struct {
	name   string
	sticky bool
	errno  syscall.Errno
	code   errcode.Code
}

var faultModes = []faultMode{
	{"full-once", false, syscall.ENOSPC, errcode.StorageFull},
	{"readonly-from-then-on", true, syscall.EROFS, errcode.StorageUnavailable},
}

// templateTx is one transaction of the template store, run with faults armed on what setup
// made; check judges the state after a failure (or after a success that a full disk's
// fallback made), with a store whose file system works again.
type templateTx struct {
	name  string
	setup func(t *testing.T, e *env) string // returns the generation it made, if any
	run   func(t *testing.T, e *env, gen string) error
	check func(t *testing.T, e *env, gen string, mode faultMode, err error)
	// absorbsFull is set when a full disk at some step is absorbed by a fallback, so that
	// the transaction may succeed (a retirement that removes the index entry in place of
	// writing the tombstone).
	absorbsFull bool
}

// TestFaultAtEveryStep fails each changing file-system step of each transaction of the
// template store in turn (ENOSPC once, and EROFS from then on), and checks that the error
// carries the storage code, the errno and the state root, that what is left lists no half
// thing (no generation without its payload, no template or lease the caller was told was not
// made), and that Check with repair accepts it: it succeeds, reports no foreign entry and no
// damaged record, and leaves nothing for a second Check to report.
func TestFaultAtEveryStep(t *testing.T) {
	t.Parallel()
	for _, tx := range templateTxs() {
		t.Run(tx.name, func(t *testing.T) {
			t.Parallel()
			steps := countTemplateSteps(t, tx)
			if len(steps) == 0 {
				t.Fatalf("%s makes no changing step; the test is broken", tx.name)
			}
			for _, mode := range faultModes {
				for at := 1; at <= len(steps); at++ {
					t.Run(fmt.Sprintf("%s/%d-%s", mode.name, at, strings.ReplaceAll(steps[at-1], " ", ":")), func(t *testing.T) {
						runTemplateFaulted(t, tx, mode, at)
					})
				}
			}
		})
	}
}

func faultyEnv(t *testing.T, in *injector) *env {
	t.Helper()
	e := &env{root: t.TempDir(), clock: newClock(), log: &syncLog{}}
	s, err := Open(e.root, Options{Now: e.clock.Now, OnSync: e.log.add, FS: platform.FS{Fault: in.fault}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e.s = s
	return e
}

func countTemplateSteps(t *testing.T, tx templateTx) []string {
	t.Helper()
	in := &injector{}
	e := faultyEnv(t, in)
	gen := tx.setup(t, e)
	in.arm(0, false, nil)
	err := tx.run(t, e, gen)
	steps := in.disarm()
	if err != nil {
		t.Fatalf("%s without a fault: %v", tx.name, err)
	}
	return steps
}

func runTemplateFaulted(t *testing.T, tx templateTx, mode faultMode, at int) {
	in := &injector{}
	e := faultyEnv(t, in)
	gen := tx.setup(t, e)
	in.arm(at, mode.sticky, mode.errno)
	err := tx.run(t, e, gen)
	steps := in.disarm()
	if len(steps) < at {
		t.Fatalf("the fault at step %d was never reached (steps %v, err %v)", at, steps, err)
	}
	switch {
	case err == nil && !(tx.absorbsFull && !mode.sticky):
		t.Fatalf("failing step %d (%s) went unnoticed: the transaction succeeded", at, steps[at-1])
	case err != nil && (errcode.Of(err) != mode.code || !errors.Is(err, mode.errno)):
		t.Fatalf("failing step %d (%s): err = %v; want code %s wrapping %v", at, steps[at-1], err, mode.code, mode.errno)
	case err != nil && !strings.Contains(err.Error(), e.root):
		t.Fatalf("failing step %d (%s): the error %v does not name the state root", at, steps[at-1], err)
	}
	clean := openEnv(t, e.root)
	clean.clock = e.clock
	tx.check(t, clean, gen, mode, err)
	checkRepairs(t, clean)
}

// checkRepairs runs Check with repair and then without: the first must succeed without
// finding anything that is not the store's own leftover, and the second must find nothing.
func checkRepairs(t *testing.T, e *env) {
	t.Helper()
	ps, err := e.s.Check(ctxT(t), e.bindingExists(), true)
	if err != nil {
		t.Fatalf("Check with repair: %v", err)
	}
	for _, p := range ps {
		if p.Kind == ForeignEntry || p.Kind == BadRecord {
			t.Fatalf("a failed step left %v", p)
		}
	}
	if ps, err := e.s.Check(ctxT(t), e.bindingExists(), false); err != nil || len(ps) > 0 {
		t.Fatalf("after a repair Check still finds %v (%v); the repair found %v", ps, err, ps)
	}
}

// wholeGenerations fails unless every listed generation of template name is whole: an active
// one has its index entry and its payload with the captured content.
func wholeGenerations(t *testing.T, e *env, name string) []Generation {
	t.Helper()
	gens, err := e.s.Generations(name, e.clock.get())
	if err != nil {
		t.Fatalf("Generations: %v", err)
	}
	for _, g := range gens {
		if g.State != StateActive {
			continue
		}
		dir, err := e.s.PayloadDir(name, g.ID)
		if err != nil {
			t.Fatalf("active generation %s has no payload: %v", g.ID, err)
		}
		if data, err := os.ReadFile(filepath.Join(dir, "hello.txt")); err != nil || string(data) != "hello" {
			t.Fatalf("active generation %s has a half payload: %q, %v", g.ID, data, err)
		}
	}
	return gens
}

func templateTxs() []templateTx {
	created := func(t *testing.T, e *env) string {
		if _, err := e.s.CreateTemplate(ctxT(t), "t"); err != nil {
			t.Fatal(err)
		}
		return ""
	}
	captured := func(t *testing.T, e *env) string { return e.template(t, "t") }
	leased := func(t *testing.T, e *env) string {
		gen := e.template(t, "t")
		e.mustClone(t, "t", gen, "c1")
		return gen
	}
	return []templateTx{
		{
			name:  "create",
			setup: func(t *testing.T, e *env) string { return "" },
			run: func(t *testing.T, e *env, _ string) error {
				_, err := e.s.CreateTemplate(ctxT(t), "t")
				return err
			},
			check: func(t *testing.T, e *env, _ string, mode faultMode, _ error) {
				_, err := e.s.Template("t", e.clock.get())
				if err == nil && !mode.sticky {
					t.Fatal("a create that failed left the template, though its undo could run")
				}
				if !mode.sticky && exists(filepath.Join(e.s.Path(), "t")) {
					t.Fatalf("a create that failed left the template's directory")
				}
			},
		},
		{
			name:  "capture",
			setup: created,
			run: func(t *testing.T, e *env, _ string) error {
				_, err := e.s.Capture(ctxT(t), "t", smallLayer(t), testKey, nil)
				return err
			},
			check: func(t *testing.T, e *env, _ string, mode faultMode, _ error) {
				gens := wholeGenerations(t, e, "t")
				if len(gens) > 0 && !mode.sticky {
					t.Fatalf("a capture that failed left %v, though its undo could run", gens)
				}
				if !mode.sticky {
					names, _ := os.ReadDir(filepath.Join(e.s.Path(), "t"))
					for _, n := range names {
						if _, ok := platform.IsTempName(n.Name()); ok {
							t.Fatalf("a capture that failed left %s, though its undo could run", n.Name())
						}
					}
				}
				// The next capture works, and gets a new id.
				e.capture(t, "t")
			},
		},
		{
			name:  "lease",
			setup: captured,
			run: func(t *testing.T, e *env, gen string) error {
				tx, err := e.s.Lock(ctxT(t))
				if err != nil {
					return err
				}
				_, err = tx.WriteLease("t", gen, "c1")
				return errors.Join(err, tx.Unlock())
			},
			check: func(t *testing.T, e *env, gen string, mode faultMode, _ error) {
				ls, err := e.s.Leases("t", gen)
				if err != nil {
					t.Fatal(err)
				}
				if len(ls) > 0 && !mode.sticky {
					t.Fatalf("a lease that failed left %v, though its undo could run", ls)
				}
			},
		},
		{
			name: "release",
			setup: func(t *testing.T, e *env) string {
				gen := leased(t, e)
				if err := RemoveBinding(filepath.Join(e.root, "sandboxes", "c1")); err != nil {
					t.Fatal(err)
				}
				return gen
			},
			run: func(t *testing.T, e *env, gen string) error {
				ls, err := e.s.Leases("t", gen)
				if err != nil || len(ls) != 1 {
					t.Fatalf("leases %v, %v", ls, err)
				}
				return e.s.Release(ctxT(t), "t", gen, ls[0].ID)
			},
			check: func(t *testing.T, e *env, gen string, _ faultMode, _ error) { wholeGenerations(t, e, "t") },
		},
		{
			name:  "tombstone",
			setup: captured,
			run: func(t *testing.T, e *env, gen string) error {
				_, err := e.s.Tombstone(ctxT(t), "t", gen)
				return err
			},
			check: func(t *testing.T, e *env, gen string, _ faultMode, _ error) {
				g, err := e.s.Generation("t", gen, e.clock.get())
				if err != nil || (g.State != StateActive && g.State != StateTombstoned) {
					t.Fatalf("after a failed tombstone the generation reads %+v, %v", g, err)
				}
				wholeGenerations(t, e, "t")
			},
		},
		{
			name:        "retire",
			setup:       captured,
			absorbsFull: true,
			run: func(t *testing.T, e *env, gen string) error {
				_, err := e.s.Retire(ctxT(t), "t", gen, false, e.bindingExists())
				return err
			},
			check: func(t *testing.T, e *env, gen string, _ faultMode, err error) {
				gens := wholeGenerations(t, e, "t")
				if err == nil && len(gens) > 0 {
					t.Fatalf("a retirement that succeeded left %v", gens)
				}
				// Retiring again finishes it.
				if len(gens) > 0 {
					if out, err := e.s.Retire(ctxT(t), "t", gen, false, e.bindingExists()); err != nil || out != Retired {
						t.Fatalf("retiring again: %v, %v", out, err)
					}
				}
			},
		},
		{
			name:  "retire-drain",
			setup: leased,
			run: func(t *testing.T, e *env, gen string) error {
				_, err := e.s.Retire(ctxT(t), "t", gen, true, e.bindingExists())
				return err
			},
			check: func(t *testing.T, e *env, gen string, _ faultMode, _ error) {
				g, err := e.s.Generation("t", gen, e.clock.get())
				if err != nil || g.Leases != 1 {
					t.Fatalf("after a failed drain the leased generation reads %+v, %v", g, err)
				}
				if _, err := e.s.PayloadDir("t", gen); err != nil {
					t.Fatalf("a failed drain took the payload from a clone: %v", err)
				}
			},
		},
		{
			name:        "delete-template",
			setup:       captured,
			absorbsFull: true,
			run: func(t *testing.T, e *env, _ string) error {
				_, err := e.s.DeleteTemplate(ctxT(t), "t", false, e.bindingExists())
				return err
			},
			check: func(t *testing.T, e *env, _ string, _ faultMode, err error) {
				_, terr := e.s.Template("t", e.clock.get())
				if err == nil && !errors.Is(terr, errcode.TemplateNotFound) {
					t.Fatalf("a delete that succeeded left the template: %v", terr)
				}
				if terr == nil {
					wholeGenerations(t, e, "t")
				}
			},
		},
	}
}

// fullDisk is a fault that refuses every step that needs space, as a full disk does, and
// records what it refused.
type fullDisk struct {
	mu      sync.Mutex
	refused []string
}

func (f *fullDisk) fault(op platform.Op, path string) error {
	switch op {
	case platform.OpCreate, platform.OpWrite, platform.OpRename, platform.OpMkdir:
		f.mu.Lock()
		f.refused = append(f.refused, fmt.Sprintf("%s %s", op, path))
		f.mu.Unlock()
		return syscall.ENOSPC
	}
	return nil
}

func (f *fullDisk) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.refused
	f.refused = nil
	return r
}

// TestDeleteNeedsNoSpace retires a generation and deletes a template on a disk that refuses
// every step needing space: deleting is how a user frees one. A generation that a clone still
// leases cannot be quarantined without its tombstone, so its retirement answers storage-full
// and leaves it whole. Reads work, and a create or capture answers storage-full and leaves
// nothing.
func TestDeleteNeedsNoSpace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g1 := e.template(t, "t")
	g2 := e.capture(t, "t")
	e.template(t, "u")
	leasedGen := e.template(t, "v")
	e.mustClone(t, "v", leasedGen, "c1")

	full := &fullDisk{}
	s, err := Open(e.root, Options{Now: e.clock.Now, FS: platform.FS{Fault: full.fault}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := e.clock.get()

	if ts, err := s.Templates(now); err != nil || len(ts) != 3 {
		t.Fatalf("Templates on a full disk = %v, %v", ts, err)
	}
	if out, err := s.Retire(ctxT(t), "t", g1, false, e.bindingExists()); err != nil || out != Retired {
		t.Fatalf("Retire on a full disk = %v, %v", out, err)
	}
	if gens, err := s.Generations("t", now); err != nil || len(gens) != 1 || gens[0].ID != g2 {
		t.Fatalf("after the retirement Generations = %v, %v", gens, err)
	}
	if out, err := s.DeleteTemplate(ctxT(t), "u", false, e.bindingExists()); err != nil || out != Retired {
		t.Fatalf("DeleteTemplate on a full disk = %v, %v", out, err)
	}
	if refused := full.take(); len(refused) == 0 {
		t.Fatal("the full disk refused nothing: the test does not play one")
	}

	// Counted before anything is written: refused as leased, not for the full disk.
	_, err = s.Retire(ctxT(t), "v", leasedGen, false, e.bindingExists())
	wantCode(t, err, errcode.GenerationLeased)
	if g, err := s.Generation("v", leasedGen, now); err != nil || g.State != StateActive || g.Leases != 1 {
		t.Fatalf("the leased generation after a refused retirement: %+v, %v", g, err)
	}

	_, err = s.CreateTemplate(ctxT(t), "w")
	wantCode(t, err, errcode.StorageFull)
	if exists(filepath.Join(s.Path(), "w")) {
		t.Fatal("a refused create left the template's directory")
	}
	_, err = s.Capture(ctxT(t), "t", smallLayer(t), testKey, nil)
	wantCode(t, err, errcode.StorageFull)
	if gens, _ := s.Generations("t", now); len(gens) != 1 {
		t.Fatalf("a refused capture left %v", gens)
	}
	names, _ := os.ReadDir(filepath.Join(s.Path(), "t"))
	for _, n := range names {
		if _, ok := platform.IsTempName(n.Name()); ok {
			t.Fatalf("a refused capture left %s", n.Name())
		}
	}
	checkRepairs(t, e)
}

// TestCheckRepairsAnInterruptedFullDiskRetirement: a retirement on a full disk that stops
// after it removed the index entry leaves a payload without an index entry, which Check
// reports and, on a disk still full, repairs without the tombstone it cannot write.
func TestCheckRepairsAnInterruptedFullDiskRetirement(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "t")
	full := &fullDisk{}
	failPayload := func(op platform.Op, path string) error {
		if op == platform.OpUnlink && strings.Contains(path, string(filepath.Separator)+PayloadDir) {
			return syscall.EIO
		}
		return full.fault(op, path)
	}
	s, err := Open(e.root, Options{Now: e.clock.Now, FS: platform.FS{Fault: failPayload}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Retire(ctxT(t), "t", gen, false, e.bindingExists()); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Retire with a failing payload removal = %v, want EIO", err)
	}
	g, err := s.Generation("t", gen, e.clock.get())
	if err != nil || g.State != StateRetiring || g.Indexed {
		t.Fatalf("the interrupted retirement reads %+v, %v; want retiring, without an index entry", g, err)
	}
	if _, err := s.PayloadDir("t", gen); err == nil {
		t.Fatal("a generation without its index entry offers its payload to clones")
	}

	stillFull, err := Open(e.root, Options{Now: e.clock.Now, FS: platform.FS{Fault: full.fault}})
	if err != nil {
		t.Fatal(err)
	}
	defer stillFull.Close()
	ps, err := stillFull.Check(ctxT(t), e.bindingExists(), true)
	if err != nil {
		t.Fatalf("Check with repair on a full disk: %v", err)
	}
	if !slices.ContainsFunc(ps, func(p Problem) bool { return p.Kind == PayloadWithoutIndex && p.Repaired }) {
		t.Fatalf("Check found %v; want a repaired %s", ps, PayloadWithoutIndex)
	}
	if gens, err := stillFull.Generations("t", e.clock.get()); err != nil || len(gens) != 0 {
		t.Fatalf("after the repair Generations = %v, %v", gens, err)
	}
}
