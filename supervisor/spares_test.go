package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/bothy/bothy/store"
)

// TestSparesServeOnlyTheDefaults: a spare goes only to a create with start whose id the server
// chose and which asks for nothing but the spares' profile; labels and a lifetime, which a
// claim records, do not matter.
func TestSparesServeOnlyTheDefaults(t *testing.T) {
	res := Resources{VCPUs: 1, MemoryMB: 512, Pids: 512}
	sp := newSpareSet(&SpareOptions{Count: 2, Resources: res, DiskMB: 1024})
	base := func() CreateRequest {
		return CreateRequest{ID: NewSandboxID(), AnyID: true, Start: true, Resources: res, DiskMB: 1024}
	}
	if !sp.serves(base()) {
		t.Fatal("a create of the defaults is not served")
	}
	for name, change := range map[string]func(*CreateRequest){
		"labels":     func(r *CreateRequest) { r.Labels = map[string]string{"a": "b"} },
		"lifetime":   func(r *CreateRequest) { r.Lifetime = &Lifetime{Timeout: time.Minute} },
		"host image": func(r *CreateRequest) { r.Image = HostImage },
	} {
		r := base()
		change(&r)
		if !sp.serves(r) {
			t.Errorf("a create of the defaults with its own %s is not served", name)
		}
	}
	for name, change := range map[string]func(*CreateRequest){
		"an id":        func(r *CreateRequest) { r.AnyID = false },
		"no start":     func(r *CreateRequest) { r.Start = false },
		"an image":     func(r *CreateRequest) { r.Image = "alpine" },
		"a runtime":    func(r *CreateRequest) { r.Runtime = "microvm" },
		"limits":       func(r *CreateRequest) { r.Resources.MemoryMB = 256 },
		"a disk":       func(r *CreateRequest) { r.DiskMB = 64 },
		"environment":  func(r *CreateRequest) { r.Env = map[string]string{"A": "1"} },
		"a network":    func(r *CreateRequest) { r.Network = &NetworkPolicy{Internet: true} },
		"a clone":      func(r *CreateRequest) { r.Clone = &CloneRequest{Template: "t"} },
		"none to keep": func(*CreateRequest) { sp.opts.Count = 0 },
	} {
		r := base()
		change(&r)
		if sp.serves(r) {
			t.Errorf("a create with %s is served a spare", name)
		}
		sp.opts.Count = 2
	}
	if id := NewSandboxID(); store.ValidateID(id) != nil || len(id) != 15 {
		t.Fatalf("NewSandboxID made %q", id)
	}
}

// TestSpareWithADeadlineIsNotKept: a claim writes the create's lifetime before it rewrites the
// configuration without the mark; a crash between leaves a spare with a deadline, which the
// next supervisor deletes rather than give out, making a fresh one instead. A supervisor that
// closes deletes its spares.
func TestSpareWithADeadlineIsNotKept(t *testing.T) {
	s, root := newSupervisor(t)
	opts := &SpareOptions{Count: 1, Resources: Resources{VCPUs: 1, MemoryMB: 512, Pids: 512}}
	s.spares = newSpareSet(opts)
	s.StartSpares()
	first := waitReady(t, s, 1)[0]
	// The crash: the refill stops as a killed process's would, and the claim got as far as
	// the deadline.
	s.spares.stop()
	<-s.spares.done
	dir := filepath.Join(root, "sandboxes", first)
	if err := writeDeadline(dir, newDeadline(Lifetime{Timeout: time.Hour}, time.Now())); err != nil {
		t.Fatal(err)
	}

	again, err := open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	again.spares = newSpareSet(opts)
	ctx := testContext(t)
	if err := again.ReattachAll(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	again.StartSpares()
	if second := waitReady(t, again, 1)[0]; second == first {
		t.Fatalf("the spare with a deadline, %s, is kept", first)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Fatalf("the spare with a deadline is not deleted: %v", err)
	}
	again.Close()
	ids, err := s.store.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 0 {
		t.Fatalf("sandboxes left by a supervisor that closed with a spare: %v", ids)
	}
}

// waitReady waits until s keeps n ready spares and returns them.
func waitReady(t *testing.T, s *Supervisor, n int) []string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s.spares.mu.Lock()
		ready := slices.Clone(s.spares.ready)
		s.spares.mu.Unlock()
		if len(ready) == n {
			return ready
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares ready after 60s, want %d", len(ready), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNoSparesOnAnUnavailableRuntime: a default runtime that cannot take sandboxes here (a
// kernel without a feature they need, found at start-up) makes the spare pool give up at
// once, with nothing made, where it retried and logged for ever. Without the check the refill
// never ends and the wait below times out.
func TestNoSparesOnAnUnavailableRuntime(t *testing.T) {
	s, _ := newSupervisor(t)
	s.runtimes.unavailable[s.rt.Kind()] = errors.New("this host's kernel cannot give the runtime a feature")
	s.spares = newSpareSet(&SpareOptions{Count: 1, Resources: Resources{VCPUs: 1, MemoryMB: 512, Pids: 512}})
	s.StartSpares()
	select {
	case <-s.spares.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the spare pool still tries after 30s on a runtime that takes no sandboxes")
	}
	if ids, err := s.store.List(); err != nil || len(ids) != 0 {
		t.Fatalf("sandboxes %v (%v) made for spares", ids, err)
	}
}
