package template

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/record"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		check func(string) error
		in    string
		ok    bool
	}{
		{"name plain", ValidateName, "python-base", true},
		{"name digit first", ValidateName, "1abc", true},
		{"name dash first", ValidateName, "-abc", false},
		{"name upper", ValidateName, "Abc", false},
		{"name traversal", ValidateName, "..", false},
		{"name slash", ValidateName, "a/b", false},
		{"name too long", ValidateName, strings.Repeat("a", 64), false},
		{"name longest", ValidateName, strings.Repeat("a", 63), true},
		{"gen", ValidateGeneration, "g000001", true},
		{"gen seven digits", ValidateGeneration, "g1000000", true},
		{"gen zero", ValidateGeneration, "g000000", false},
		{"gen short", ValidateGeneration, "g00001", false},
		{"gen unpadded", ValidateGeneration, "g0000001", false},
		{"gen letters", ValidateGeneration, "gabcdef", false},
		{"lease", ValidateLeaseID, "l-0123456789abcdef", true},
		{"lease upper", ValidateLeaseID, "l-0123456789ABCDEF", false},
		{"lease short", ValidateLeaseID, "l-0123", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := c.check(c.in)
			if (err == nil) != c.ok {
				t.Fatalf("validate %q = %v; want ok=%v", c.in, err, c.ok)
			}
			if err != nil && errcode.Of(err) != errcode.InvalidRequest {
				t.Fatalf("code %q; want invalid-request", errcode.Of(err))
			}
		})
	}
	// Every generation id the store makes is also a valid API id.
	for _, n := range []uint64{1, 999999, 1000000, 1 << 40} {
		if id := generationID(n); !naming.ValidID(id) || ValidateGeneration(id) != nil {
			t.Fatalf("generation id %q is not valid", id)
		}
	}
	if id := newLeaseID(); !naming.ValidID(id) || ValidateLeaseID(id) != nil {
		t.Fatalf("lease id %q is not valid", id)
	}
}

func TestEligibility(t *testing.T) {
	t.Parallel()
	const max = 30 * 24 * time.Hour
	base := TimeContract{HostID: "h", BootID: "b", Clock: ClockBoottime, Monotonic: time.Hour, UTC: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	at := func(f func(*TimeContract)) TimeContract { c := base; f(&c); return c }
	cases := []struct {
		name     string
		now      TimeContract
		want     Eligibility
		wantDown time.Duration
	}{
		{"same boot uses monotonic even if UTC jumped back", at(func(c *TimeContract) { c.Monotonic += time.Minute; c.UTC = c.UTC.Add(-time.Hour) }), Eligible, time.Minute},
		{"same boot uses monotonic even if UTC jumped far ahead", at(func(c *TimeContract) { c.Monotonic += time.Minute; c.UTC = c.UTC.Add(2 * max) }), Eligible, time.Minute},
		{"same boot beyond max", at(func(c *TimeContract) { c.Monotonic += max + time.Second }), Expired, max + time.Second},
		{"same boot exactly max", at(func(c *TimeContract) { c.Monotonic += max }), Eligible, max},
		{"same boot monotonic behind", at(func(c *TimeContract) { c.Monotonic -= time.Second; c.UTC = c.UTC.Add(time.Hour) }), Early, -time.Second},
		{"other boot uses UTC", at(func(c *TimeContract) { c.BootID = "b2"; c.Monotonic = time.Second; c.UTC = c.UTC.Add(time.Hour) }), Eligible, time.Hour},
		{"other boot UTC before capture", at(func(c *TimeContract) { c.BootID = "b2"; c.Monotonic = 10 * time.Hour; c.UTC = c.UTC.Add(-time.Second) }), Early, -time.Second},
		{"other boot UTC beyond max", at(func(c *TimeContract) { c.BootID = "b2"; c.UTC = c.UTC.Add(max + time.Hour) }), Expired, max + time.Hour},
		{"other host uses UTC", at(func(c *TimeContract) {
			c.HostID = "h2"
			c.Monotonic += 40 * 24 * time.Hour
			c.UTC = c.UTC.Add(time.Hour)
		}), Eligible, time.Hour},
		{"other clock uses UTC", at(func(c *TimeContract) { c.Clock = "monotonic"; c.Monotonic -= time.Minute; c.UTC = c.UTC.Add(time.Hour) }), Eligible, time.Hour},
	}
	// A host without a machine id: the boot id still names the boot.
	noHost := base
	noHost.HostID = ""
	later := noHost
	later.Monotonic += time.Minute
	later.UTC = later.UTC.Add(-time.Hour)
	if got, down := EligibilityAt(noHost, later, max); got != Eligible || down != time.Minute {
		t.Fatalf("no host id, same boot: %s, %v; want monotonic", got, down)
	}
	if got, down := EligibilityAt(base, later, max); got != Early || down != -time.Hour {
		t.Fatalf("host id on one side only: %s, %v; want UTC", got, down)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, down := EligibilityAt(base, c.now, max)
			if got != c.want || down != c.wantDown {
				t.Fatalf("EligibilityAt = %s, %v; want %s, %v", got, down, c.want, c.wantDown)
			}
		})
	}
}

func TestTemplateLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxT(t)
	if _, err := e.s.Template("nope", e.clock.get()); errcode.Of(err) != errcode.TemplateNotFound {
		t.Fatalf("get missing: %v", err)
	}
	if _, err := e.s.CreateTemplate(ctx, "Bad/Name"); errcode.Of(err) != errcode.InvalidRequest {
		t.Fatalf("bad name: %v", err)
	}
	if exists(filepath.Join(e.s.Path(), "Bad")) {
		t.Fatal("a bad name touched a path")
	}
	if _, err := e.s.CreateTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if got := e.log.take(); !slices.Equal(got, []string{StepTemplateCreate}) {
		t.Fatalf("steps %v", got)
	}
	if _, err := e.s.CreateTemplate(ctx, "py"); errcode.Of(err) != errcode.TemplateExists {
		t.Fatalf("create twice: %v", err)
	}
	if _, err := e.s.CreateTemplate(ctx, "go"); err != nil {
		t.Fatal(err)
	}
	list, err := e.s.Templates(e.clock.get())
	if err != nil || len(list) != 2 || list[0].Name != "go" || list[1].Name != "py" {
		t.Fatalf("list %+v, %v", list, err)
	}
	gen := e.capture(t, "py")
	tp, err := e.s.Template("py", e.clock.get())
	if err != nil || tp.Generations != 1 || tp.Latest != gen {
		t.Fatalf("get %+v, %v", tp, err)
	}
	st, err := os.Stat(filepath.Join(e.s.Path(), "py"))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("template dir mode %v, %v", st, err)
	}
	out, err := e.s.DeleteTemplate(ctx, "py", false, nil)
	if err != nil || out != Retired {
		t.Fatalf("delete: %v, %v", out, err)
	}
	if exists(filepath.Join(e.s.Path(), "py")) {
		t.Fatal("template directory remains")
	}
	if _, err := e.s.DeleteTemplate(ctx, "py", false, nil); errcode.Of(err) != errcode.TemplateNotFound {
		t.Fatalf("delete twice: %v", err)
	}
	// A template made again starts a new series.
	if _, err := e.s.CreateTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
}

func TestCaptureOrderAndIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxT(t)
	if _, err := e.s.Capture(ctx, "missing", smallLayer(t), testKey, nil); errcode.Of(err) != errcode.TemplateNotFound {
		t.Fatalf("capture into a missing template: %v", err)
	}
	if _, err := e.s.CreateTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	e.log.take()
	src := smallLayer(t)
	var calls [][2]int64
	g, err := e.s.Capture(ctx, "py", src, testKey, func(c, tot int64) { calls = append(calls, [2]int64{c, tot}) })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := e.log.take(), []string{StepCaptureReserve, StepCaptureCopied, StepCaptureIndex, StepCaptureCommit}; !slices.Equal(got, want) {
		t.Fatalf("capture steps %v; want %v", got, want)
	}
	if g.ID != "g000001" || g.State != StateActive || g.Eligibility != Eligible || g.SizeBytes != 9 || g.Key != testKey {
		t.Fatalf("generation %+v", g)
	}
	if g.Time != e.clock.get() || !g.CapturedAt.Equal(e.clock.get().UTC) {
		t.Fatalf("time contract %+v", g.Time)
	}
	if len(calls) == 0 || calls[len(calls)-1] != [2]int64{9, 9} {
		t.Fatalf("progress %v", calls)
	}
	for i := 1; i < len(calls); i++ {
		if calls[i][0] < calls[i-1][0] {
			t.Fatalf("progress went back: %v", calls)
		}
	}
	// The source stays intact.
	if b, err := os.ReadFile(filepath.Join(src, "hello.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("source changed: %q, %v", b, err)
	}
	g2 := e.capture(t, "py")
	if out, err := e.s.Retire(ctx, "py", g2, false, nil); err != nil || out != Retired {
		t.Fatal(out, err)
	}
	// Ids are never reused, also after the newest was retired.
	if g3 := e.capture(t, "py"); g3 != "g000003" {
		t.Fatalf("third capture %s", g3)
	}
	p, err := e.s.PayloadDir("py", "g000001")
	if err != nil || p != filepath.Join(e.s.Path(), "py", "g000001", PayloadDir) {
		t.Fatalf("payload %q, %v", p, err)
	}
	if b, err := os.ReadFile(filepath.Join(p, "etc", "app", "conf")); err != nil || string(b) != "x=1\n" {
		t.Fatalf("payload content %q, %v", b, err)
	}
	// No staging leftovers.
	names, _ := os.ReadDir(filepath.Join(e.s.Path(), "py"))
	for _, n := range names {
		if strings.HasSuffix(n.Name(), ".tmp") {
			t.Fatalf("leftover %s", n.Name())
		}
	}
}

func TestCloneAndReleaseOrder(t *testing.T) {
	// Not parallel: the binding hook is package-wide.
	e := newEnv(t)
	h := func(step string) { e.log.add(step) }
	testBindingHook.Store(&h)
	t.Cleanup(func() { testBindingHook.Store(nil) })
	gen := e.template(t, "py")
	e.log.take()
	l := e.mustClone(t, "py", gen, "sbx-1")
	if got, want := e.log.take(), []string{StepLeaseWrite, "binding:write"}; !slices.Equal(got, want) {
		t.Fatalf("clone steps %v; want %v", got, want)
	}
	b, err := ReadBinding(filepath.Join(e.root, "sandboxes", "sbx-1"))
	if err != nil || b.Lease != l.ID || b.Generation != gen || b.Template != "py" || b.Format != BindingFormat {
		t.Fatalf("binding %+v, %v", b, err)
	}
	leases, err := e.s.Leases("py", gen)
	if err != nil || len(leases) != 1 || leases[0].ID != l.ID || leases[0].Sandbox != "sbx-1" {
		t.Fatalf("leases %+v, %v", leases, err)
	}
	// One lease per sandbox.
	if _, err := e.clone(t, "py", gen, "sbx-1"); errcode.Of(err) != errcode.SandboxLeased {
		t.Fatalf("second lease: %v", err)
	}
	v, _ := e.s.Generation("py", gen, e.clock.get())
	if v.Leases != 1 {
		t.Fatalf("view %+v", v)
	}
	e.release(t, "sbx-1")
	if got, want := e.log.take(), []string{"binding:remove", StepLeaseRemove}; !slices.Equal(got, want) {
		t.Fatalf("release steps %v; want %v", got, want)
	}
	if leases, _ := e.s.Leases("py", gen); len(leases) != 0 {
		t.Fatalf("leases after release %+v", leases)
	}
	// Releasing again, or a lease of a generation that is gone, is not an error.
	if err := e.s.Release(ctxT(t), "py", gen, l.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.s.Release(ctxT(t), "gone", gen, l.ID); err != nil {
		t.Fatal(err)
	}
}

func TestLeasableAndSelect(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxT(t)
	g1 := e.template(t, "py")
	e.clock.advance(time.Hour)
	g2 := e.capture(t, "py")
	other := testKey
	other.Resources.MemoryMB = 512
	g3, err := e.s.Capture(ctx, "py", smallLayer(t), other, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := e.clock.get()
	sel, err := e.s.Select("py", testKey, now)
	if err != nil || sel.ID != g2 {
		t.Fatalf("select %+v, %v", sel, err)
	}
	if sel, err := e.s.Select("py", other, now); err != nil || sel.ID != g3.ID {
		t.Fatalf("select other key %+v, %v", sel, err)
	}
	if _, err := e.s.Tombstone(ctx, "py", g2); err != nil {
		t.Fatal(err)
	}
	if sel, err := e.s.Select("py", testKey, now); err != nil || sel.ID != g1 {
		t.Fatalf("select skips the tombstone: %+v, %v", sel, err)
	}
	if _, err := e.s.Select("nope", testKey, now); errcode.Of(err) != errcode.TemplateNotFound {
		t.Fatal(err)
	}
	// g1 expires 30 days after its capture; g3 does not match.
	e.clock.advance(30*24*time.Hour - 30*time.Minute)
	_, err = e.s.Select("py", testKey, e.clock.get())
	wantCode(t, err, errcode.TemplateIneligible)
	for _, want := range []string{g1 + " is expired", g2 + " is tombstoned", g3.ID + " has another compatibility key"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("select error %q does not say %q", err, want)
		}
	}
	tx, err := e.s.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Unlock()
	cases := []struct {
		name, tmpl, gen string
		now             TimeContract
		code            errcode.Code
		msg             string
	}{
		{"eligible", "py", g3.ID, e.clock.get(), "", ""},
		{"expired", "py", g1, e.clock.get(), errcode.TemplateIneligible, "expired"},
		{"early", "py", g3.ID, at(g3.Time, -time.Second), errcode.TemplateIneligible, "early"},
		{"tombstoned", "py", g2, e.clock.get(), errcode.TemplateTombstoned, ""},
		{"missing generation", "py", "g000009", e.clock.get(), errcode.GenerationNotFound, ""},
		{"missing template", "nope", "g000001", e.clock.get(), errcode.TemplateNotFound, ""},
		{"bad generation", "py", "../x", e.clock.get(), errcode.InvalidRequest, ""},
	}
	for _, c := range cases {
		_, err := tx.Leasable(c.tmpl, c.gen, c.now)
		if errcode.Of(err) != c.code || !strings.Contains(errString(err), c.msg) {
			t.Errorf("%s: Leasable = %v; want %q with %q", c.name, err, c.code, c.msg)
		}
	}
	if _, err := tx.WriteLease("py", g2, "sbx"); errcode.Of(err) != errcode.TemplateTombstoned {
		t.Fatalf("lease of a tombstone: %v", err)
	}
}

func at(c TimeContract, d time.Duration) TimeContract {
	c.Monotonic += d
	c.UTC = c.UTC.Add(d)
	return c
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestTombstoneKeepsClones(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	e.mustClone(t, "py", gen, "a")
	e.log.take()
	v, err := e.s.Tombstone(ctxT(t), "py", gen)
	if err != nil || v.State != StateTombstoned || v.Leases != 1 {
		t.Fatalf("tombstone %+v, %v", v, err)
	}
	if got := e.log.take(); !slices.Equal(got, []string{StepTombstone}) {
		t.Fatalf("steps %v", got)
	}
	if _, err := e.clone(t, "py", gen, "b"); errcode.Of(err) != errcode.TemplateTombstoned {
		t.Fatalf("clone of a tombstone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.s.Path(), "py", gen, PayloadDir, "hello.txt")); err != nil {
		t.Fatalf("payload of a tombstoned generation: %v", err)
	}
	if _, err := e.s.Tombstone(ctxT(t), "py", gen); err != nil {
		t.Fatal(err)
	}
	if got := e.log.take(); len(got) != 0 {
		t.Fatalf("a second tombstone wrote %v", got)
	}
}

func TestRetire(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxT(t)
	gen := e.template(t, "py")
	la := e.mustClone(t, "py", gen, "a")
	lb := e.mustClone(t, "py", gen, "b")
	e.log.take()

	// Leased: refused, naming the leases, and nothing changed.
	_, err := e.s.Retire(ctx, "py", gen, false, e.bindingExists())
	wantCode(t, err, errcode.GenerationLeased)
	var le *LeasedError
	if !errors.As(err, &le) || len(le.Leases) != 2 || !strings.Contains(err.Error(), la.ID) || !strings.Contains(err.Error(), lb.ID) {
		t.Fatalf("leased error %v", err)
	}
	if got := e.log.take(); len(got) != 0 {
		t.Fatalf("a refused retirement wrote %v", got)
	}
	if v, _ := e.s.Generation("py", gen, e.clock.get()); v.State != StateActive || v.Eligibility != Eligible {
		t.Fatalf("after a refused retirement: state %s, %s", v.State, v.Eligibility)
	}
	// The sweep removes a lease whose binding is gone (a clone whose removal crashed after
	// clone.json went).
	if err := RemoveBinding(filepath.Join(e.root, "sandboxes", "a")); err != nil {
		t.Fatal(err)
	}
	_, err = e.s.Retire(ctx, "py", gen, false, e.bindingExists())
	wantCode(t, err, errcode.GenerationLeased)
	if strings.Contains(err.Error(), la.ID) {
		t.Fatalf("swept lease still named: %v", err)
	}
	if got := e.log.take(); !slices.Equal(got, []string{StepLeaseSweep}) {
		t.Fatalf("steps %v", got)
	}
	// Drain: 202, and the last release finishes it.
	out, err := e.s.Retire(ctx, "py", gen, true, e.bindingExists())
	if err != nil || out != Draining {
		t.Fatalf("drain: %v, %v", out, err)
	}
	if v, _ := e.s.Generation("py", gen, e.clock.get()); v.State != StateRetiring || !v.Drain {
		t.Fatalf("state %+v", v)
	}
	e.log.take()
	e.release(t, "b")
	want := []string{StepLeaseRemove, StepRetirePayload, StepRetireIndex, StepRetireTombstone, StepRetireDir}
	if got := e.log.take(); !slices.Equal(got, want) {
		t.Fatalf("release steps %v; want %v", got, want)
	}
	if exists(filepath.Join(e.s.Path(), "py", gen)) {
		t.Fatal("generation directory remains")
	}
	// Unleased: tombstone, payload, index, tombstone, directory.
	g2 := e.capture(t, "py")
	e.log.take()
	out, err = e.s.Retire(ctx, "py", g2, false, nil)
	if err != nil || out != Retired {
		t.Fatal(out, err)
	}
	want = []string{StepTombstone, StepRetirePayload, StepRetireIndex, StepRetireTombstone, StepRetireDir}
	if got := e.log.take(); !slices.Equal(got, want) {
		t.Fatalf("retire steps %v; want %v", got, want)
	}
	if _, err := e.s.Retire(ctx, "py", g2, false, nil); errcode.Of(err) != errcode.GenerationNotFound {
		t.Fatal(err)
	}
}

func TestRetireInterruptedFinishes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	gdir := filepath.Join(e.s.Path(), "py", gen)
	// The state an interruption after the payload step leaves.
	if _, err := e.s.Tombstone(ctxT(t), "py", gen); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(gdir, PayloadDir)); err != nil {
		t.Fatal(err)
	}
	v, err := e.s.Generation("py", gen, e.clock.get())
	if err != nil || v.State != StateRetiring {
		t.Fatalf("view %+v, %v", v, err)
	}
	if _, err := e.s.PayloadDir("py", gen); errcode.Of(err) != errcode.GenerationNotFound {
		t.Fatal(err)
	}
	if _, err := e.clone(t, "py", gen, "a"); errcode.Of(err) != errcode.TemplateTombstoned {
		t.Fatal(err)
	}
	// And after the index step.
	if err := os.Remove(filepath.Join(gdir, IndexName)); err != nil {
		t.Fatal(err)
	}
	if out, err := e.s.Retire(ctxT(t), "py", gen, false, nil); err != nil || out != Retired {
		t.Fatal(out, err)
	}
	if exists(gdir) {
		t.Fatal("generation remains")
	}
}

func TestDeleteTemplateDrain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxT(t)
	g1 := e.template(t, "py")
	g2 := e.capture(t, "py")
	e.mustClone(t, "py", g1, "a")
	_, err := e.s.DeleteTemplate(ctx, "py", false, e.bindingExists())
	wantCode(t, err, errcode.GenerationLeased)
	// Refused as a whole: g2, which no clone leases, is kept, and g1 is as it was.
	if !exists(filepath.Join(e.s.Path(), "py", g2)) {
		t.Fatal("a refused template deletion retired an unleased generation")
	}
	if v, _ := e.s.Generation("py", g1, e.clock.get()); v.State != StateActive {
		t.Fatalf("state %s", v.State)
	}
	out, err := e.s.DeleteTemplate(ctx, "py", true, e.bindingExists())
	if err != nil || out != Draining {
		t.Fatal(out, err)
	}
	if tp, _ := e.s.Template("py", e.clock.get()); !tp.Deleting {
		t.Fatalf("template %+v", tp)
	}
	if _, err := e.s.Capture(ctx, "py", smallLayer(t), testKey, nil); errcode.Of(err) != errcode.TemplateTombstoned {
		t.Fatalf("capture into a deleting template: %v", err)
	}
	if _, err := e.s.CreateTemplate(ctx, "py"); errcode.Of(err) != errcode.TemplateExists {
		t.Fatal(err)
	}
	e.log.take()
	e.release(t, "a")
	got := e.log.take()
	if n := len(got); n < 2 || got[n-2] != StepTemplateRemove || got[n-1] != StepTemplateDir {
		t.Fatalf("steps %v", got)
	}
	if exists(filepath.Join(e.s.Path(), "py")) {
		t.Fatal("template remains after the last release")
	}
}

func TestLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	tx, err := e.s.Lock(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := contextTimeout(100 * time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_, err = e.s.Lock(ctx)
	wantCode(t, err, errcode.TransitionInProgress)
	// Against the deadline itself: a clock read after the context was made could be late
	// on a loaded machine and make an on-time give-up look early.
	if early := time.Until(deadline); early > 0 {
		t.Fatalf("gave up %s before the deadline", early)
	}
	if _, err := e.s.Lock(contextNoDeadline()); errcode.Of(err) != errcode.InvalidRequest {
		t.Fatal(err)
	}
	if err := tx.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Unlock(); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.WriteLease("py", "g000001", "a"); err == nil {
		t.Fatal("a released Tx still writes")
	}
	tx2, err := e.s.Lock(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	tx2.Unlock()
}

func TestLockFileRefused(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"symlink", "fifo", "dir"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			lock := filepath.Join(e.s.Path(), LockName)
			target := filepath.Join(t.TempDir(), "elsewhere")
			var err error
			switch kind {
			case "symlink":
				os.WriteFile(target, nil, 0o600)
				err = os.Symlink(target, lock)
			case "fifo":
				err = syscall.Mkfifo(lock, 0o600)
			case "dir":
				err = os.Mkdir(lock, 0o700)
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.s.Lock(ctxT(t)); err == nil || errcode.Of(err) != errcode.Internal {
				t.Fatalf("lock on a %s: %v", kind, err)
			}
		})
	}
}

func TestUnknownFormatRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	path := filepath.Join(e.s.Path(), "py", gen, IndexName)
	if err := os.WriteFile(path, []byte(`{"format": 99, "id": "g000001"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := e.s.Generation("py", gen, e.clock.get())
	var fe *record.FormatError
	if !errors.As(err, &fe) || fe.Format != 99 || !strings.Contains(err.Error(), "format 99") {
		t.Fatalf("unknown format: %v", err)
	}
	dir := e.sandboxDir(t, "x")
	os.WriteFile(filepath.Join(dir, BindingFile), []byte(`{"format": 7}`), 0o600)
	if _, err := ReadBinding(dir); !errors.As(err, &fe) || fe.Format != 7 {
		t.Fatalf("binding format: %v", err)
	}
}

func TestBindingFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := ReadBinding(dir); !errors.Is(err, ErrNoBinding) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
	if err := CheckUnbound(dir, "a"); err != nil {
		t.Fatal(err)
	}
	b := &Binding{Template: "py", Generation: "g000001", Lease: "l-0123456789abcdef", AcquiredAt: time.Unix(1, 0).UTC()}
	if err := WriteBinding(dir, b); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(filepath.Join(dir, BindingFile))
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	got, err := ReadBinding(dir)
	if err != nil || got.Lease != b.Lease || got.Format != BindingFormat {
		t.Fatalf("read %+v, %v", got, err)
	}
	wantCode(t, CheckUnbound(dir, "a"), errcode.SandboxLeased)
	if err := WriteBinding(dir, &Binding{Template: "py", Generation: "../x", Lease: b.Lease}); err == nil {
		t.Fatal("a binding with a bad generation was written")
	}
	if err := RemoveBinding(dir); err != nil {
		t.Fatal(err)
	}
	if err := RemoveBinding(dir); err != nil {
		t.Fatal(err)
	}
	// A link or a FIFO is refused, never followed or blocked on.
	target := filepath.Join(t.TempDir(), "t")
	os.WriteFile(target, []byte("{}"), 0o600)
	os.Symlink(target, filepath.Join(dir, BindingFile))
	if _, err := ReadBinding(dir); err == nil || errors.Is(err, ErrNoBinding) {
		t.Fatalf("symlink: %v", err)
	}
	os.Remove(filepath.Join(dir, BindingFile))
	syscall.Mkfifo(filepath.Join(dir, BindingFile), 0o600)
	if _, err := ReadBinding(dir); err == nil || errors.Is(err, ErrNoBinding) {
		t.Fatalf("fifo: %v", err)
	}
}

// TestCaptureRacesDelete deletes (and makes again) the template while a capture copies: the
// capture must not commit into the deleted template nor into its successor, and must leave no
// staging directory behind.
func TestCaptureRacesDelete(t *testing.T) {
	t.Parallel()
	for _, again := range []bool{false, true} {
		t.Run(map[bool]string{false: "deleted", true: "made-again"}[again], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if _, err := e.s.CreateTemplate(ctxT(t), "py"); err != nil {
				t.Fatal(err)
			}
			done := false
			_, err := e.s.Capture(ctxT(t), "py", bigLayer(t), testKey, func(copied, total int64) {
				if copied == 0 || done {
					return
				}
				done = true
				// The copy runs without the store's lock, so a delete proceeds meanwhile.
				if out, err := e.s.DeleteTemplate(ctxT(t), "py", false, nil); err != nil || out != Retired {
					t.Errorf("delete during capture: %v, %v", out, err)
				}
				if again {
					if _, err := e.s.CreateTemplate(ctxT(t), "py"); err != nil {
						t.Error(err)
					}
				}
			})
			wantCode(t, err, errcode.TemplateNotFound)
			tdir := filepath.Join(e.s.Path(), "py")
			if !again {
				if exists(tdir) {
					t.Fatal("the deleted template's directory remains")
				}
				return
			}
			gens, err := e.s.Generations("py", e.clock.get())
			if err != nil || len(gens) != 0 {
				t.Fatalf("the new template got %+v, %v", gens, err)
			}
			names, _ := os.ReadDir(tdir)
			if len(names) != 1 || names[0].Name() != TemplateRecordName {
				t.Fatalf("template directory holds %v", names)
			}
		})
	}
}

func TestSelectUnderLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	tx, err := e.s.Lock(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	g, err := tx.Select("py", testKey, e.clock.get())
	if err != nil || g.ID != gen {
		t.Fatalf("select %+v, %v", g, err)
	}
	// Nothing can tombstone it while the lock is held.
	ctx, cancel := contextTimeout(50 * time.Millisecond)
	defer cancel()
	_, err = e.s.Tombstone(ctx, "py", gen)
	wantCode(t, err, errcode.TransitionInProgress)
	if _, err := tx.WriteLease("py", g.ID, "a"); err != nil {
		t.Fatal(err)
	}
	tx.Unlock()
}

func TestNewerGeneration(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want bool
	}{
		{"g000002", "g000001", true},
		{"g000001", "g000002", false},
		{"g1000000", "g999999", true},
		{"g999999", "g1000000", false},
		{"g000001", "", true},
		{"", "g000001", false},
		{"g000001", "g000001", false},
		{"g0000010", "g000001", false}, // not an id: older than any
	}
	for _, tt := range tests {
		if got := NewerGeneration(tt.a, tt.b); got != tt.want {
			t.Errorf("NewerGeneration(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}
