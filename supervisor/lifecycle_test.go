package supervisor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// openWithEvents is open with an event channel.
func openWithEvents(t *testing.T, root string, wrap func(runtime.Runtime) runtime.Runtime) (*Supervisor, <-chan Event) {
	t.Helper()
	st, err := store.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := namespace.New(namespace.Config{CgroupParent: testCgroupParent})
	if err != nil {
		t.Fatal(err)
	}
	var r runtime.Runtime = rt
	if wrap != nil {
		r = wrap(rt)
	}
	ch := make(chan Event, 256)
	s, err := New(Options{Store: st, Runtime: r, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StopGrace: time.Second,
		OnEvent: func(e Event) {
			select {
			case ch <- e:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	return s, ch
}

// awaitEvent waits for an event of type typ about id.
func awaitEvent(t *testing.T, ctx context.Context, ch <-chan Event, typ, id string) Event {
	t.Helper()
	for {
		select {
		case e := <-ch:
			if e.Type == typ && e.Sandbox == id {
				return e
			}
		case <-ctx.Done():
			t.Fatalf("no %s event for %s: %v", typ, id, ctx.Err())
		}
	}
}

func requirePause(t *testing.T, s *Supervisor) runtime.Pauser {
	t.Helper()
	p, err := s.pauser()
	if err != nil {
		t.Skipf("this host cannot pause sandboxes: %v", err)
	}
	return p
}

func startNew(t *testing.T, ctx context.Context, s *Supervisor, id string) *Status {
	t.Helper()
	st, err := s.Create(ctx, CreateRequest{ID: id, Start: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.State != StateRunning {
		t.Fatalf("create with start: state %s", st.State)
	}
	return st
}

// TestForcedDelete: a running sandbox, and a paused one, are killed and removed in one call;
// without force a running one is refused.
func TestForcedDelete(t *testing.T) {
	s, root := newSupervisor(t)
	ctx := testContext(t)
	startNew(t, ctx, s, "rmf")
	if err := s.Delete(ctx, "rmf", false); errcode.Of(err) != errcode.SandboxLaunched {
		t.Fatalf("delete of a running sandbox: %v, want sandbox-launched", err)
	}
	if err := s.Delete(ctx, "rmf", true); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
	if _, err := s.Status("rmf"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("status after the forced delete: %v, want sandbox-not-found", err)
	}
	if n := shims(t, s, root); n != 0 {
		t.Fatalf("%d runtime processes after the forced delete", n)
	}

	requirePause(t, s)
	startNew(t, ctx, s, "rmf-paused")
	if _, err := s.Pause(ctx, "rmf-paused"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "rmf-paused", true); err != nil {
		t.Fatalf("forced delete of a paused sandbox: %v", err)
	}
	if n := shims(t, s, root); n != 0 {
		t.Fatalf("%d runtime processes after the forced delete of a paused sandbox", n)
	}
}

// failingStart is a runtime whose launches fail.
type failingStart struct{ runtime.Runtime }

func (failingStart) Start(context.Context, runtime.Spec) (platform.ProcessID, error) {
	return platform.ProcessID{}, errors.New("the test refuses every launch")
}

// TestCreateStartIsAllOrNothing: a create with start whose start fails leaves no sandbox, so
// the id is free again; a crash between the provision and the start's commit leaves one that
// the next start-up removes.
func TestCreateStartIsAllOrNothing(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	s, _ := openWithEvents(t, root, func(r runtime.Runtime) runtime.Runtime { return failingStart{r} })
	defer s.Close()
	ctx := testContext(t)
	if _, err := s.Create(ctx, CreateRequest{ID: "aon", Start: true}); err == nil {
		t.Fatal("a create whose start fails succeeded")
	}
	if _, err := s.Status("aon"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("status after the failed create: %v, want sandbox-not-found", err)
	}
	if _, err := s.Create(ctx, CreateRequest{ID: "aon"}); err != nil {
		t.Fatalf("the id is not free after the failed create: %v", err)
	}

	// What a crash before the start's commit leaves: a provisioned sandbox with the mark.
	dir := filepath.Join(root, store.SandboxesDir, "aon")
	if err := platform.WriteFileDurable(dir, PendingName, []byte("start\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.ReattachAll(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Status("aon"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("status after the start-up: %v, want sandbox-not-found", err)
	}
}

// TestPauseSurvivesRestart: a paused sandbox refuses exec, stays paused across a restart of
// the supervisor, and resumes; a pause or resume interrupted between its record and the
// freezer is finished by the next start-up the way its record says.
func TestPauseSurvivesRestart(t *testing.T) {
	s, root := newSupervisor(t)
	p := requirePause(t, s)
	ctx := testContext(t)
	startNew(t, ctx, s, "nap")
	st, err := s.Pause(ctx, "nap")
	if err != nil || st.State != StatePaused {
		t.Fatalf("pause: %+v, %v", st, err)
	}
	if _, err := s.AdmitExec(ctx, "nap", 100*time.Millisecond); errcode.Of(err) != errcode.SandboxPaused {
		t.Fatalf("exec on a paused sandbox: %v, want sandbox-paused", err)
	}
	if _, err := s.ListFiles(ctx, "nap", "/", "user"); errcode.Of(err) != errcode.SandboxPaused {
		t.Fatalf("files on a paused sandbox: %v, want sandbox-paused", err)
	}
	s.Close()

	again, err := open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(again.Close)
	if err := again.ReattachAll(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, store.SandboxesDir, "nap")
	if st, err := again.Status("nap"); err != nil || st.State != StatePaused {
		t.Fatalf("after the restart: %+v, %v", st, err)
	}
	if frozen, err := p.Frozen("nap", dir); err != nil || !frozen {
		t.Fatalf("frozen after the restart: %v, %v", frozen, err)
	}
	if st, err := again.Resume(ctx, "nap"); err != nil || st.State != StateRunning {
		t.Fatalf("resume: %+v, %v", st, err)
	}
	if err := execTrue(ctx, again, "nap"); err != nil {
		t.Fatalf("exec after the resume: %v", err)
	}

	// A resume that crashed after removing the record: frozen, no record.
	if err := p.Freeze(ctx, "nap", dir); err != nil {
		t.Fatal(err)
	}
	if err := again.ReattachAll(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if frozen, err := p.Frozen("nap", dir); err != nil || frozen {
		t.Fatalf("an interrupted resume was not finished: frozen %v, %v", frozen, err)
	}
	// A pause that crashed after writing the record: a record, not frozen.
	if _, err := again.Pause(ctx, "nap"); err != nil {
		t.Fatal(err)
	}
	if err := p.Thaw(ctx, "nap", dir); err != nil {
		t.Fatal(err)
	}
	if err := again.ReattachAll(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if frozen, err := p.Frozen("nap", dir); err != nil || !frozen {
		t.Fatalf("an interrupted pause was not finished: frozen %v, %v", frozen, err)
	}
	if st, err := again.Stop(ctx, "nap", false); err != nil || st.State != StateStopped {
		t.Fatalf("stop of a paused sandbox: %+v, %v", st, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, PausedName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pause record outlived the stop: %v", err)
	}
}

// TestLifetime: a lifetime ends a running sandbox (reason expired, event sandbox.expired);
// one that ended while no supervisor ran is acted on at the next start-up; on_timeout delete
// removes the sandbox.
func TestLifetime(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	s, events := openWithEvents(t, root, nil)
	ctx := testContext(t)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ids, _ := s.store.List()
		for _, id := range ids {
			_ = s.Delete(cctx, id, true)
		}
		s.Close()
	})
	if _, err := s.Create(ctx, CreateRequest{ID: "short", Start: true, Lifetime: &Lifetime{Timeout: time.Second}}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status("short")
	if err != nil || st.ExpiresAt == nil || st.OnTimeout != TimeoutStop {
		t.Fatalf("status with a lifetime: %+v, %v", st, err)
	}
	e := awaitEvent(t, ctx, events, EventExpired, "short")
	if e.Exit == nil || e.Exit.Reason != ReasonExpired {
		t.Fatalf("expired event: %+v", e)
	}
	st, err = s.Status("short")
	if err != nil || st.State != StateStopped || st.LastExit == nil || st.LastExit.Reason != ReasonExpired || st.ExpiresAt != nil {
		t.Fatalf("status after the expiry: %+v, %v", st, err)
	}

	// Expiry while down: set a lifetime, close, wait until it has passed, open again.
	if _, err := s.Start(ctx, "short"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetTimeout(ctx, "short", &Lifetime{Timeout: time.Second, OnTimeout: TimeoutDelete}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	dir := filepath.Join(root, store.SandboxesDir, "short")
	for {
		d, err := readDeadline(dir)
		if err != nil || d == nil {
			t.Fatalf("the lifetime record: %+v, %v", d, err)
		}
		if d.left(time.Now()) <= 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if st, err := s.store.ReadRuntimeRecordUnlocked("short"); err != nil || st == nil {
		t.Fatalf("the sandbox stopped while no supervisor ran: %+v, %v", st, err)
	}
	s, events = openWithEvents(t, root, nil)
	if err := s.ReattachAll(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	awaitEvent(t, ctx, events, EventDeleted, "short")
	if _, err := s.Status("short"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("after the expiry with on_timeout delete: %v, want sandbox-not-found", err)
	}
	if n := shims(t, s, root); n != 0 {
		t.Fatalf("%d runtime processes after the expiry", n)
	}
}

// TestCaptureOfARunningSandbox: a capture freezes a running sandbox for the copy only and
// reports the freeze, leaves a paused one paused, and a capture that dies by SIGKILL while the
// sandbox is frozen leaves it frozen with no pause record, which the next start-up thaws.
func TestCaptureOfARunningSandbox(t *testing.T) {
	s, root := newSupervisor(t)
	p := requirePause(t, s)
	ts, err := template.Open(root, template.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.templates = ts
	ctx := testContext(t)
	if _, err := ts.CreateTemplate(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	startNew(t, ctx, s, "live")
	dir := filepath.Join(root, store.SandboxesDir, "live")
	g, err := s.Capture(ctx, "live", "live")
	if err != nil {
		t.Fatalf("capture of a running sandbox: %v", err)
	}
	if g.CapturePauseMS <= 0 {
		t.Fatalf("capture_pause_ms %d for the capture of a running sandbox", g.CapturePauseMS)
	}
	if frozen, err := p.Frozen("live", dir); err != nil || frozen {
		t.Fatalf("frozen after the capture: %v, %v", frozen, err)
	}
	if err := execTrue(ctx, s, "live"); err != nil {
		t.Fatalf("exec after the capture: %v", err)
	}

	if _, err := s.Pause(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	if g, err := s.Capture(ctx, "live", "live"); err != nil || g.CapturePauseMS != 0 {
		t.Fatalf("capture of a paused sandbox: %+v, %v", g, err)
	}
	if st, err := s.Status("live"); err != nil || st.State != StatePaused {
		t.Fatalf("after the capture of a paused sandbox: %+v, %v", st, err)
	}
	if frozen, err := p.Frozen("live", dir); err != nil || !frozen {
		t.Fatalf("the capture thawed a paused sandbox: frozen %v, %v", frozen, err)
	}
	if _, err := s.Resume(ctx, "live"); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashRoot+"="+root, envCrashID+"=live", envCrashAt+"=capture-frozen", envCrashCapture+"=live")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the helper did not die by SIGKILL while the sandbox was frozen: %v\n%s", err, out)
	}
	if frozen, err := p.Frozen("live", dir); err != nil || !frozen {
		t.Fatalf("the helper's capture did not freeze the sandbox: %v, %v", frozen, err)
	}
	if err := s.ReattachAll(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if frozen, err := p.Frozen("live", dir); err != nil || frozen {
		t.Fatalf("the start-up after a crashed capture left the sandbox frozen: %v, %v", frozen, err)
	}
	if st, err := s.Status("live"); err != nil || st.State != StateRunning {
		t.Fatalf("after the start-up: %+v, %v", st, err)
	}
	if err := execTrue(ctx, s, "live"); err != nil {
		t.Fatalf("exec after the start-up: %v", err)
	}
}

// TestReattachSweepsUnboundLeases: a crash between a clone's lease and its binding, or between
// a removal's deprovision and its release, leaves a lease that no binding names; the start-up
// reconciliation releases it (so the generation is not held and `bothyd check` finds
// nothing), and keeps the lease of a clone that is bound.
func TestReattachSweepsUnboundLeases(t *testing.T) {
	s, root := newSupervisor(t)
	withTemplates := func(sv *Supervisor) {
		ts, err := template.Open(root, template.Options{})
		if err != nil {
			t.Fatal(err)
		}
		sv.templates = ts
	}
	withTemplates(s)
	ctx := testContext(t)
	if _, err := s.templates.CreateTemplate(ctx, "tpl"); err != nil {
		t.Fatal(err)
	}
	startNew(t, ctx, s, "src")
	if _, err := s.Stop(ctx, "src", true); err != nil {
		t.Fatal(err)
	}
	g, err := s.Capture(ctx, "tpl", "src")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"bound", "unbound"} {
		if _, err := s.Clone(ctx, store.Config{ID: id}, CloneRequest{Template: "tpl"}); err != nil {
			t.Fatal(err)
		}
	}
	// "unbound" as a clone that crashed between its lease and its binding.
	dir, err := s.store.Dir("unbound")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, template.BindingFile)); err != nil {
		t.Fatal(err)
	}
	// A lease of a sandbox that is gone, as a removal that crashed before its release.
	tx, err := s.templates.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.WriteLease("tpl", g.ID, "gone"); err != nil {
		t.Fatal(err)
	}
	tx.Unlock()
	unbound := func(sv *Supervisor) (n int) {
		probs, err := sv.templates.Check(ctx, template.BindingChecker(sv.store.Dir), false)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range probs {
			if p.Kind == template.LeaseWithoutBinding {
				n++
			}
		}
		return n
	}
	if n := unbound(s); n != 2 {
		t.Fatalf("before the restart: %d leases without a binding, want 2", n)
	}
	s.Close()

	again, err := open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	withTemplates(again)
	// Without a deadline, as bothyd's start-up pass runs: the sweep must bring its own.
	if err := again.ReattachAll(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := unbound(again); n != 0 {
		t.Fatalf("after the reconciliation: %d leases without a binding", n)
	}
	now, err := again.templates.Now()
	if err != nil {
		t.Fatal(err)
	}
	gen, err := again.templates.Generation("tpl", g.ID, now)
	if err != nil {
		t.Fatal(err)
	}
	if gen.Leases != 1 {
		t.Fatalf("generation %s holds %d leases after the sweep, want the bound clone's 1", g.ID, gen.Leases)
	}
}

// TestOperationReconcilesBeforeTheStartUpPass: bothyd serves while its start-up reattach
// pass runs, so an operation can reach a sandbox that the pass has not; it reconciles that
// sandbox first, as the pass would. Here the sandbox is what a crashed create with start
// leaves, which the reconciliation removes: the start finds no sandbox instead of starting it.
func TestOperationReconcilesBeforeTheStartUpPass(t *testing.T) {
	s, ctx := crashedCreateUnreconciled(t, false)
	if _, err := s.Start(ctx, "early"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("start of an unreconciled crashed create: %v, want sandbox-not-found", err)
	}
	if s.isUnreconciled("early") {
		t.Fatal("the sandbox still waits for its reconciliation")
	}
	if _, err := s.Status("early"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("status afterwards: %v, want sandbox-not-found", err)
	}
}

// crashedCreateUnreconciled makes the sandbox "early" as a crashed create with start leaves
// it (its pending record says start), not yet reached by the start-up pass, as StartReattach
// leaves it; passRunning: the pass has not ended either.
func crashedCreateUnreconciled(t *testing.T, passRunning bool) (*Supervisor, context.Context) {
	t.Helper()
	requireRoot(t)
	s, root := newSupervisor(t)
	ctx := testContext(t)
	if _, err := s.Create(ctx, CreateRequest{ID: "early"}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, store.SandboxesDir, "early")
	if err := platform.WriteFileDurable(dir, PendingName, []byte("start\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.unreconciled = map[string]bool{"early": true}
	if passRunning {
		s.reconciled = make(chan struct{})
	}
	s.mu.Unlock()
	return s, ctx
}

// TestStatusSettlesBeforeTheStartUpPass: while the start-up pass runs, a status of a sandbox
// it has not reached reconciles that sandbox first, so it never reads as a crash left it
// (here a crashed create with start, which the reconciliation removes).
func TestStatusSettlesBeforeTheStartUpPass(t *testing.T) {
	s, _ := crashedCreateUnreconciled(t, true)
	if st, err := s.Status("early"); errcode.Of(err) != errcode.SandboxNotFound {
		t.Fatalf("status of an unreconciled crashed create: %+v, %v; want sandbox-not-found", st, err)
	}
}
