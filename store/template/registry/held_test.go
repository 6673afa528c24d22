//go:build linux

package registry

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/template"
)

// status is the status of a HEAD of the manifest tag (or digest) names.
func (tr *testRegistry) status(t *testing.T, ref string) int {
	t.Helper()
	resp, err := http.Head(tr.srv.URL + "/v2/bothy/templates/manifests/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// marks lists the holders' marks on a generation in the registry, as holder ids.
func (tr *testRegistry) marks(t *testing.T, tmpl, gen string) []string {
	t.Helper()
	repo, err := name.NewRepository(tr.repo(), name.Insecure)
	must(t, err)
	tags, err := remote.List(repo)
	must(t, err)
	var ids []string
	for _, tag := range tags {
		if id, ok := strings.CutPrefix(tag, Tag(tmpl, gen)+heldInfix); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func newHolder(t *testing.T, reg *testRegistry, ts *template.Store, holder string) *Registry {
	t.Helper()
	r, err := New(Options{Repository: reg.repo(), Holder: holder}, ts)
	must(t, err)
	return r
}

// retireHere retires a generation without leases from a store: its copy is gone.
func retireHere(t *testing.T, ts *template.Store, tmpl, gen string) {
	t.Helper()
	out, err := ts.Retire(ctx(t), tmpl, gen, false, func(string, string) bool { return false })
	if err != nil || out != template.Retired {
		t.Fatalf("retire %s/%s: %v %v", tmpl, gen, out, err)
	}
}

// TestDeleteAfterLastHolder: a generation pushed by A and pulled by B is marked by both. A
// retires it and records the tombstone: A's mark goes, the registry's copy stays, for B
// holds one. B's copy goes: B's mark goes and the copy is deleted (manifest by tag and by
// digest 404), the tombstone stays, and C's pull of it is refused as tombstoned without a
// mark left behind.
func TestDeleteAfterLastHolder(t *testing.T) {
	reg := newTestRegistry(t)
	sa, sb, sc := openStore(t), openStore(t), openStore(t)
	gen := captured(t, sa)
	a, b, c := newHolder(t, reg, sa, "a"), newHolder(t, reg, sb, "b"), newHolder(t, reg, sc, "c")
	digest, err := a.Push(ctx(t), "base", gen)
	must(t, err)
	must(t, b.Pull(ctx(t), "base", gen))
	if got, want := reg.marks(t, "base", gen), sortedIDs("a", "b"); !slices.Equal(got, want) {
		t.Fatalf("marks after a push on A and a pull on B: %v, want %v", got, want)
	}

	// Release of a generation still held changes nothing.
	must(t, a.Release(ctx(t), "base", gen))
	retireHere(t, sa, "base", gen)
	must(t, a.Tombstone(ctx(t), "base", gen, true))
	must(t, a.Release(ctx(t), "base", gen))
	if got, want := reg.marks(t, "base", gen), sortedIDs("b"); !slices.Equal(got, want) {
		t.Fatalf("marks after A retired its copy: %v, want %v", got, want)
	}
	if st := reg.status(t, Tag("base", gen)); st != http.StatusOK {
		t.Fatalf("the registry's copy while B holds one: HEAD %d, want 200", st)
	}
	// A's sweep deletes nothing while B's mark is there.
	done, err := a.Collect(ctx(t))
	must(t, err)
	if len(done.Deleted) != 0 {
		t.Fatalf("a sweep deleted %v while B holds a copy", done.Deleted)
	}

	retireHere(t, sb, "base", gen)
	must(t, b.Release(ctx(t), "base", gen))
	if got := reg.marks(t, "base", gen); len(got) != 0 {
		t.Fatalf("marks after B retired its copy: %v", got)
	}
	for _, ref := range []string{Tag("base", gen), digest} {
		if st := reg.status(t, ref); st != http.StatusNotFound {
			t.Fatalf("the registry's copy (%s) once no node holds one: HEAD %d, want 404", ref, st)
		}
	}
	if st := reg.status(t, TombstoneTag("base", gen)); st != http.StatusOK {
		t.Fatalf("the tombstone after the deletion: HEAD %d, want 200", st)
	}
	if err := c.Pull(ctx(t), "base", gen); errcode.Of(err) != errcode.TemplateTombstoned {
		t.Fatalf("C's pull of the deleted generation: %v, want template-tombstoned", err)
	}
	if got := reg.marks(t, "base", gen); len(got) != 0 {
		t.Fatalf("C's refused pull left marks %v", got)
	}
	// Again: nothing left to do, no error.
	must(t, b.Release(ctx(t), "base", gen))
}

func sortedIDs(holders ...string) []string {
	var ids []string
	for _, h := range holders {
		ids = append(ids, HolderID(h))
	}
	slices.Sort(ids)
	return ids
}

// TestCollect: a sweep removes this holder's mark on a generation it does not hold (a pull
// cut by a crash left it), marks again a generation it holds whose mark is gone, and
// deletes the copy of a tombstoned generation no holder marks; a quarantine's tombstone
// keeps the copy while its holder keeps its (tombstoned) copy.
func TestCollect(t *testing.T) {
	reg := newTestRegistry(t)
	sa, sb := openStore(t), openStore(t)
	gen := captured(t, sa)
	a, b := newHolder(t, reg, sa, "a"), newHolder(t, reg, sb, "b")
	_, err := a.Push(ctx(t), "base", gen)
	must(t, err)

	// B's pull was cut after its mark: the mark is there, the copy is not.
	must(t, b.hold(ctx(t), "base", gen))
	// A's mark is lost.
	must(t, a.deleteTag(ctx(t), HeldTag("base", gen, a.holderID)))
	must(t, a.Tombstone(ctx(t), "base", gen, false))

	done, err := a.Collect(ctx(t))
	must(t, err)
	if !slices.Equal(done.Held, []string{Tag("base", gen)}) || len(done.Deleted) != 0 {
		t.Fatalf("A's sweep: %+v, want %s marked again and nothing deleted", done, Tag("base", gen))
	}
	done, err = b.Collect(ctx(t))
	must(t, err)
	if !slices.Equal(done.Released, []string{Tag("base", gen)}) || len(done.Deleted) != 0 {
		t.Fatalf("B's sweep: %+v, want its mark released and nothing deleted (A holds a copy)", done)
	}
	if st := reg.status(t, Tag("base", gen)); st != http.StatusOK {
		t.Fatalf("a quarantined generation A holds: HEAD %d, want 200", st)
	}

	// A's copy goes while the registry is away from A (no Release): A's next sweep
	// releases its mark and deletes the copy.
	retireHere(t, sa, "base", gen)
	done, err = a.Collect(ctx(t))
	must(t, err)
	if !slices.Equal(done.Deleted, []string{Tag("base", gen)}) {
		t.Fatalf("A's sweep after its copy went: %+v, want %s deleted", done, Tag("base", gen))
	}
	if st := reg.status(t, Tag("base", gen)); st != http.StatusNotFound {
		t.Fatalf("after the sweep: HEAD %d, want 404", st)
	}
	done, err = a.Collect(ctx(t))
	must(t, err)
	if len(done.Deleted)+len(done.Held)+len(done.Released) != 0 {
		t.Fatalf("a second sweep did %+v, want nothing", done)
	}
}

// TestDeleteRefused: a registry that refuses DELETE (deletion off) keeps the copy and the
// marks (A's, and the one C's refused pull could not remove); Release answers
// registry-refused, and the generation stays refused to pulls by its tombstone. Once
// DELETE is allowed, the sweeps finish: A's removes its mark, C's removes its own and,
// the last, deletes the copy.
func TestDeleteRefused(t *testing.T) {
	reg := newTestRegistry(t)
	sa, sc := openStore(t), openStore(t)
	gen := captured(t, sa)
	a, c := newHolder(t, reg, sa, "a"), newHolder(t, reg, sc, "c")
	_, err := a.Push(ctx(t), "base", gen)
	must(t, err)
	retireHere(t, sa, "base", gen)
	must(t, a.Tombstone(ctx(t), "base", gen, true))

	reg.refuseDelete.Store(true)
	if err := a.Release(ctx(t), "base", gen); errcode.Of(err) != errcode.RegistryRefused {
		t.Fatalf("release with DELETE refused: %v, want registry-refused", err)
	}
	if st := reg.status(t, Tag("base", gen)); st != http.StatusOK {
		t.Fatalf("with DELETE refused: HEAD %d, want 200", st)
	}
	if err := c.Pull(ctx(t), "base", gen); errcode.Of(err) != errcode.TemplateTombstoned {
		t.Fatalf("a pull with DELETE refused: %v, want template-tombstoned", err)
	}

	if got, want := reg.marks(t, "base", gen), sortedIDs("a", "c"); !slices.Equal(got, want) {
		t.Fatalf("marks with DELETE refused: %v, want %v", got, want)
	}

	reg.refuseDelete.Store(false)
	done, err := a.Collect(ctx(t))
	must(t, err)
	if !slices.Equal(done.Released, []string{Tag("base", gen)}) || len(done.Deleted) != 0 {
		t.Fatalf("A's sweep once DELETE is allowed: %+v, want its mark released and nothing deleted (C's mark is there)", done)
	}
	done, err = c.Collect(ctx(t))
	must(t, err)
	if !slices.Equal(done.Released, []string{Tag("base", gen)}) || !slices.Equal(done.Deleted, []string{Tag("base", gen)}) {
		t.Fatalf("C's sweep: %+v, want its mark released and the copy deleted", done)
	}
	if st := reg.status(t, Tag("base", gen)); st != http.StatusNotFound {
		t.Fatalf("after the sweeps: HEAD %d, want 404", st)
	}
}

// TestDropHoldUnderPull: a sweep does not remove this holder's mark on a generation whose
// pull is in flight in this process (the store does not hold it yet), and removes it once
// the pull is over and the store still lacks it.
func TestDropHoldUnderPull(t *testing.T) {
	reg := newTestRegistry(t)
	r := newHolder(t, reg, openStore(t), "b")
	must(t, r.hold(ctx(t), "base", "g000001"))
	r.mu.Lock()
	r.flights[Tag("base", "g000001")] = &flight{done: make(chan struct{})}
	r.mu.Unlock()
	done, err := r.Collect(ctx(t))
	must(t, err)
	if len(done.Released) != 0 || len(reg.marks(t, "base", "g000001")) != 1 {
		t.Fatalf("a sweep under a pull in flight: %+v, marks %v; want the mark kept", done, reg.marks(t, "base", "g000001"))
	}
	r.mu.Lock()
	delete(r.flights, Tag("base", "g000001"))
	r.mu.Unlock()
	done, err = r.Collect(ctx(t))
	must(t, err)
	if !slices.Equal(done.Released, []string{Tag("base", "g000001")}) || len(reg.marks(t, "base", "g000001")) != 0 {
		t.Fatalf("a sweep after the pull: %+v, marks %v; want the mark removed", done, reg.marks(t, "base", "g000001"))
	}
}

// BenchmarkHold is what a mark adds to a pull or a push on loopback: its configuration
// blob (a HEAD, and an upload the first time) and its manifest.
func BenchmarkHold(b *testing.B) {
	reg := newTestRegistry(b)
	r, err := New(Options{Repository: reg.repo(), Holder: "b"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		if err := r.hold(ctx, "base", fmt.Sprintf("g%06d", i)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCollectUnpushed: a sweep lists the store's active generations of which the registry
// has no tag (a push that failed or was cut), and none once the generation is pushed, nor
// one that is tombstoned here.
func TestCollectUnpushed(t *testing.T) {
	reg := newTestRegistry(t)
	sa := openStore(t)
	gen := captured(t, sa)
	a := newHolder(t, reg, sa, "a")
	done, err := a.Collect(ctx(t))
	must(t, err)
	if want := []Ref{{Template: "base", Generation: gen}}; !slices.Equal(done.Unpushed, want) {
		t.Fatalf("a sweep before any push: unpushed %+v, want %+v", done.Unpushed, want)
	}
	_, err = a.Push(ctx(t), "base", gen)
	must(t, err)
	if done, err = a.Collect(ctx(t)); err != nil || len(done.Unpushed) != 0 {
		t.Fatalf("a sweep after the push: %+v %v, want nothing unpushed", done, err)
	}
	g2, err := sa.Capture(ctx(t), "base", t.TempDir(), template.Key{Runtime: "namespace/test", Image: "host"}, nil)
	must(t, err)
	_, err = sa.Tombstone(ctx(t), "base", g2.ID)
	must(t, err)
	if done, err = a.Collect(ctx(t)); err != nil || len(done.Unpushed) != 0 {
		t.Fatalf("a sweep with a tombstoned generation never pushed: %+v %v, want nothing unpushed", done, err)
	}
}
