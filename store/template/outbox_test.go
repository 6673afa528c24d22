package template

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/bothy/bothy/platform"
)

// TestOutbox: a record is durable (its step reported), a retirement's is not replaced by a
// later tombstone's, a pushed tombstone does not settle a retirement recorded meanwhile, and
// RemoteTombstoneDue judges a record by the generation's state here: active (never made)
// false, tombstoned or gone true. Check skips the outbox's records and removes a temp
// leftover of one with repair; a foreign entry there is reported.
func TestOutbox(t *testing.T) {
	e := newEnv(t)
	gen := e.template(t, "py")
	e.log.take()

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(e.s.RecordRemoteTombstone(ctxT(t), "py", gen, false))
	if got := e.log.take(); !slices.Equal(got, []string{StepOutboxWrite}) {
		t.Fatalf("steps of a record: %v", got)
	}
	recs, err := e.s.RemoteTombstones()
	must(err)
	if len(recs) != 1 || recs[0].Template != "py" || recs[0].Generation != gen || recs[0].Retire {
		t.Fatalf("records: %+v", recs)
	}
	if due, err := e.s.RemoteTombstoneDue(recs[0]); err != nil || due {
		t.Fatalf("due of a tombstone whose generation is active here: %v %v, want false", due, err)
	}
	if _, err := e.s.Tombstone(ctxT(t), "py", gen); err != nil {
		t.Fatal(err)
	}
	if due, err := e.s.RemoteTombstoneDue(recs[0]); err != nil || !due {
		t.Fatalf("due of a tombstone made here: %v %v, want true", due, err)
	}

	// A retirement replaces the tombstone's record; a tombstone does not replace it back,
	// and a tombstone pushed does not settle it.
	must(e.s.RecordRemoteTombstone(ctxT(t), "py", gen, true))
	must(e.s.RecordRemoteTombstone(ctxT(t), "py", gen, false))
	must(e.s.RemoteTombstoneDone(ctxT(t), "py", gen, false))
	if recs, err = e.s.RemoteTombstones(); err != nil || len(recs) != 1 || !recs[0].Retire {
		t.Fatalf("records after a tombstone over a retirement: %+v %v", recs, err)
	}
	if due, err := e.s.RemoteTombstoneDue(RemoteTombstone{Template: "gone", Generation: gen}); err != nil || !due {
		t.Fatalf("due of a record whose template is gone: %v %v, want true", due, err)
	}

	// Check: the record is no problem; a temp leftover is one, repaired; a foreign entry
	// is reported and kept.
	if ps, err := e.s.Check(ctxT(t), e.bindingExists(), false); err != nil || len(ps) != 0 {
		t.Fatalf("check with a record in the outbox: %v %v", ps, err)
	}
	out := filepath.Join(e.root, TemplatesDir, OutboxDir)
	temp := filepath.Join(out, platform.TempName(outboxName("py", gen)))
	must(os.WriteFile(temp, []byte("{"), 0o600))
	must(os.WriteFile(filepath.Join(out, "stray"), nil, 0o600))
	ps, err := e.s.Check(ctxT(t), e.bindingExists(), true)
	must(err)
	kinds := map[ProblemKind]bool{}
	for _, p := range ps {
		kinds[p.Kind] = true
	}
	if len(ps) != 2 || !kinds[StagingLeftover] || !kinds[ForeignEntry] {
		t.Fatalf("check with a leftover and a stray entry: %v", ps)
	}
	if exists(temp) || !exists(filepath.Join(out, "stray")) {
		t.Fatal("repair did not remove the leftover, or removed the foreign entry")
	}

	must(e.s.RemoteTombstoneDone(ctxT(t), "py", gen, true))
	if recs, err = e.s.RemoteTombstones(); err != nil || len(recs) != 0 {
		t.Fatalf("records after the retirement was pushed: %+v %v", recs, err)
	}
}

// TestOutboxLink: an outbox that is a link is reported (foreign) by Check, never followed:
// start-up's RemoveLeftovers passes it by, and a record is refused rather than written
// through it.
func TestOutboxLink(t *testing.T) {
	e := newEnv(t)
	gen := e.template(t, "py")
	elsewhere := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(e.root, TemplatesDir, OutboxDir)); err != nil {
		t.Fatal(err)
	}
	if err := e.s.RemoveLeftovers(ctxT(t)); err != nil {
		t.Fatalf("RemoveLeftovers with a linked outbox: %v", err)
	}
	ps, err := e.s.Check(ctxT(t), e.bindingExists(), true)
	if err != nil || len(ps) != 1 || ps[0].Kind != ForeignEntry || ps[0].Repaired {
		t.Fatalf("check of a linked outbox: %v %v, want one foreign entry, not repaired", ps, err)
	}
	if err := e.s.RecordRemoteTombstone(ctxT(t), "py", gen, false); err == nil {
		t.Fatal("a record was written through a linked outbox")
	}
	if names, _ := os.ReadDir(elsewhere); len(names) != 0 {
		t.Fatalf("the link's target holds %v", names)
	}
}
