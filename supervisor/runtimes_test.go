package supervisor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/store"
)

// kinded is a runtime of another kind that runs its sandboxes with the namespace runtime,
// and records which of its methods were called.
type kinded struct {
	runtime.Runtime
	kind  string
	mu    sync.Mutex
	calls []string
}

func (k *kinded) Kind() string     { return k.kind }
func (k *kinded) Identity() string { return k.kind + "/" + k.Runtime.Identity() }
func (k *kinded) called(m string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, m)
}

func (k *kinded) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.calls)
}

func (k *kinded) Start(ctx context.Context, spec runtime.Spec) (platform.ProcessID, error) {
	k.called("Start")
	return k.Runtime.Start(ctx, spec)
}

func (k *kinded) Kill(ctx context.Context, dir string, id platform.ProcessID) error {
	k.called("Kill")
	return k.Runtime.Kill(ctx, dir, id)
}

func (k *kinded) Cleanup(ctx context.Context, sandboxID, dir string, id platform.ProcessID) error {
	k.called("Cleanup")
	return k.Runtime.Cleanup(ctx, sandboxID, dir, id)
}

// Processes lists none: the namespace runtime beside it lists its shims already.
func (k *kinded) Processes(string) ([]runtime.Process, error) { return nil, nil }

// probed is a runtime whose probe answers when the test releases it.
type probed struct {
	runtime.Runtime
	release chan struct{}
	err     error
}

func (p *probed) Kind() string      { return "probed" }
func (p *probed) AccelMode() string { return "auto" }
func (p *probed) Probe() (string, error) {
	<-p.release
	return "tcg", p.err
}

func quietOptions(t *testing.T, rt runtime.Runtime) Options {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	return Options{Store: st, Runtime: rt, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StopGrace: time.Second}
}

// TestRuntimeRefusals: a create naming a runtime that the server lacks, turned off or whose
// probe failed is refused with unavailable and the reason, and leaves no sandbox; /v1/info's
// list says probing until the probe answers, then unavailable with its error.
func TestRuntimeRefusals(t *testing.T) {
	ns, err := namespace.New(namespace.Config{CgroupParent: testCgroupParent})
	if err != nil {
		t.Fatal(err)
	}
	p := &probed{Runtime: ns, release: make(chan struct{}), err: errors.New("no QEMU here")}
	opts := quietOptions(t, ns)
	opts.Runtimes = []runtime.Runtime{p}
	opts.Unavailable = map[string]error{"microvm": errors.New("missing qemu-system-x86_64")}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.ProbeRuntimes()
	ctx := testContext(t)
	if rs := s.Runtimes(); len(rs) != 3 || rs[0].Kind != "namespace" || !rs[0].Default || rs[0].State != RuntimeReady ||
		rs[1].Kind != "probed" || rs[1].State != RuntimeProbing || rs[1].AccelMode != "auto" || rs[0].AccelMode != "" ||
		rs[2].Kind != "microvm" || rs[2].State != RuntimeUnavailable || rs[2].Reason != "missing qemu-system-x86_64" {
		t.Fatalf("runtimes while probing: %+v", rs)
	}
	if _, err := s.Create(ctx, CreateRequest{ID: "vm", Runtime: "microvm"}); errcode.Of(err) != errcode.Unavailable {
		t.Fatalf("a create under a missing runtime: %v", err)
	}
	if _, err := s.Create(ctx, CreateRequest{ID: "vm", Runtime: "nope"}); errcode.Of(err) != errcode.InvalidRequest {
		t.Fatalf("a create under an unknown runtime: %v", err)
	}
	close(p.release)
	deadline := time.Now().Add(10 * time.Second)
	for s.Runtimes()[1].State == RuntimeProbing && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if r := s.Runtimes()[1]; r.State != RuntimeUnavailable || r.Reason != "no QEMU here" || r.Accelerator != "" {
		t.Fatalf("the runtime whose probe failed: %+v", r)
	}
	if _, err := s.Create(ctx, CreateRequest{ID: "vm", Runtime: "probed"}); errcode.Of(err) != errcode.Unavailable {
		t.Fatalf("a create under a runtime whose probe failed: %v", err)
	}
	if ids, _ := s.store.List(); len(ids) != 0 {
		t.Fatalf("refused creates left sandboxes %v", ids)
	}
}

// TestRuntimeRouting: a sandbox created under a second runtime is started, force-stopped and
// cleaned up through that runtime, recorded with its kind, and reads back with it; the
// default runtime's sandboxes do not reach it.
func TestRuntimeRouting(t *testing.T) {
	requireRoot(t)
	ns, err := namespace.New(namespace.Config{CgroupParent: testCgroupParent})
	if err != nil {
		t.Fatal(err)
	}
	other := &kinded{Runtime: ns, kind: "other"}
	opts := quietOptions(t, ns)
	opts.Runtimes = []runtime.Runtime{other}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := testContext(t)
	st, err := s.Create(ctx, CreateRequest{ID: "plain", Start: true})
	if err != nil || st.Runtime != "namespace" {
		t.Fatalf("a default create: %+v, %v", st, err)
	}
	if c := other.Calls(); len(c) != 0 {
		t.Fatalf("a namespace sandbox reached the other runtime: %v", c)
	}
	st, err = s.Create(ctx, CreateRequest{ID: "routed", Runtime: "other", Start: true})
	if err != nil || st.Runtime != "other" || st.State != StateRunning || st.RuntimeMismatch {
		t.Fatalf("a create under the other runtime: %+v, %v", st, err)
	}
	cfg, err := s.store.ReadConfigUnlocked("routed")
	if err != nil || cfg.Runtime != "other" {
		t.Fatalf("the configuration record: %+v, %v", cfg, err)
	}
	rec, err := s.store.ReadRuntimeRecordUnlocked("routed")
	if err != nil || rec.RuntimeKind != "other" || rec.RuntimeID != other.Identity() {
		t.Fatalf("the runtime record: %+v, %v", rec, err)
	}
	if c := other.Calls(); !slices.Equal(c, []string{"Start"}) {
		t.Fatalf("calls after the start: %v", c)
	}
	if _, err := s.Stop(ctx, "routed", true); err != nil {
		t.Fatal(err)
	}
	if c := other.Calls(); !slices.Equal(c, []string{"Start", "Kill", "Cleanup"}) {
		t.Fatalf("calls after a forced stop: %v", c)
	}
	for _, id := range []string{"plain", "routed"} {
		if err := s.Delete(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
}
