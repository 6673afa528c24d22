package template

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bothy/bothy/errcode"
)

// checkInvariants checks what must hold after any crash: every clone binding names an
// existing lease record of an indexed generation whose payload is present; no untombstoned
// generation lacks its payload or index entry; nothing foreign or unreadable appeared.
func (e *env) checkInvariants(t *testing.T) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(e.root, "sandboxes"))
	for _, ent := range entries {
		b, err := ReadBinding(filepath.Join(e.root, "sandboxes", ent.Name()))
		if errcodeOrNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatalf("binding of %s: %v", ent.Name(), err)
		}
		gdir := filepath.Join(e.s.Path(), b.Template, b.Generation)
		for _, must := range []string{IndexName, PayloadDir, filepath.Join(LeasesDir, b.Lease+leaseExt)} {
			if !exists(filepath.Join(gdir, must)) {
				t.Fatalf("the binding of %s names %s/%s, which lacks %s", ent.Name(), b.Template, b.Generation, must)
			}
		}
	}
	gens, err := e.s.Generations("py", e.clock.get())
	if err != nil && errcode.Of(err) != errcode.TemplateNotFound {
		t.Fatal(err)
	}
	for _, g := range gens {
		if g.State == StateActive && !exists(filepath.Join(e.s.Path(), "py", g.ID, PayloadDir)) {
			t.Fatalf("active generation %s without payload", g.ID)
		}
	}
	problems, err := e.s.Check(ctxT(t), e.bindingExists(), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		switch p.Kind {
		case ForeignEntry, BadRecord, PayloadWithoutIndex, IndexWithoutPayload:
			t.Fatalf("after the crash: %v", p)
		}
	}
}

func errcodeOrNotExist(err error) bool {
	return errors.Is(err, ErrNoBinding)
}

// TestCrashAtEveryStep kills a process with SIGKILL at each durable step of capture, clone
// (acquire), release and retire, then checks the invariants and that the next operation
// completes or cleans up.
func TestCrashAtEveryStep(t *testing.T) {
	t.Parallel()
	type tc struct {
		op, step string
	}
	var cases []tc
	for _, s := range []string{StepCaptureReserve, "capture:progress", StepCaptureCopied, StepCaptureIndex, StepCaptureCommit} {
		cases = append(cases, tc{"capture", s})
	}
	for _, s := range []string{StepLeaseWrite, "binding:write"} {
		cases = append(cases, tc{"clone", s})
	}
	for _, s := range []string{"binding:remove", StepLeaseRemove} {
		cases = append(cases, tc{"release", s})
	}
	for _, s := range []string{StepTombstone, StepLeaseSweep, StepRetirePayload, StepRetireIndex, StepRetireTombstone, StepRetireDir} {
		cases = append(cases, tc{"retire", s})
	}
	for _, c := range cases {
		t.Run(c.op+"/"+strings.ReplaceAll(c.step, ":", "-"), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			gen := e.template(t, "py")
			args := helperArgs{Name: "py", Gen: gen}
			switch c.op {
			case "capture":
				args.Src = bigLayer(t)
			case "clone":
				args.Sandboxes = []string{"c"}
			case "release":
				e.mustClone(t, "py", gen, "c")
				args.Sandboxes = []string{"c"}
			case "retire":
				// A stale lease (its binding is gone), so that the sweep step happens.
				e.mustClone(t, "py", gen, "c")
				if err := RemoveBinding(filepath.Join(e.root, "sandboxes", "c")); err != nil {
					t.Fatal(err)
				}
			}
			mode := c.op
			if mode == "retire" {
				mode = "retire-once"
			}
			cmd := e.helper(t, mode, args, c.step)
			if st := wait(t, cmd); st != -1 {
				t.Fatalf("the helper was not killed at %s (exit %d): %s", c.step, st, output(cmd))
			}
			e.checkInvariants(t)

			switch c.op {
			case "capture":
				g, err := e.s.Capture(ctxT(t), "py", smallLayer(t), testKey, nil)
				if err != nil {
					t.Fatal(err)
				}
				gens, _ := e.s.Generations("py", e.clock.get())
				if c.step == StepCaptureCommit {
					// The crashed capture committed: its generation is whole.
					if len(gens) != 3 || g.ID != "g000003" {
						t.Fatalf("generations %+v", gens)
					}
					p, _ := e.s.PayloadDir("py", "g000002")
					if b, err := os.ReadFile(filepath.Join(p, "d3", "f3")); err != nil || len(b) != 64<<10 {
						t.Fatalf("committed payload: %d bytes, %v", len(b), err)
					}
				} else if len(gens) != 2 || g.ID != "g000003" {
					// The reserved id g000002 is skipped, never reused.
					t.Fatalf("generations %+v, new %s", gens, g.ID)
				}
				names, _ := os.ReadDir(filepath.Join(e.s.Path(), "py"))
				for _, n := range names {
					if strings.HasSuffix(n.Name(), ".tmp") {
						t.Fatalf("staging leftover %s after the next capture", n.Name())
					}
				}
			case "clone", "release", "retire":
				out, err := e.s.Retire(ctxT(t), "py", gen, false, e.bindingExists())
				if c.op == "clone" && c.step == "binding:write" {
					// A whole clone: its lease holds the generation until it is released.
					wantCode(t, err, errcode.GenerationLeased)
					e.release(t, "c")
					out, err = e.s.Retire(ctxT(t), "py", gen, false, e.bindingExists())
				}
				if c.step == StepRetireDir {
					wantCode(t, err, errcode.GenerationNotFound)
				} else if err != nil || out != Retired {
					t.Fatalf("retire after the crash: %v, %v", out, err)
				}
				if exists(filepath.Join(e.s.Path(), "py", gen)) {
					t.Fatal("generation remains")
				}
			}
			e.checkInvariants(t)
			if problems, err := e.s.Check(ctxT(t), e.bindingExists(), false); err != nil || len(problems) != 0 {
				t.Fatalf("problems after the next operation: %v, %v", problems, err)
			}
		})
	}
}

// bigLayer makes a layer large enough that a copy reports progress more than once.
func bigLayer(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	data := make([]byte, 64<<10)
	for i := range 6 {
		sub := filepath.Join(dir, fmt.Sprintf("d%d", i))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
