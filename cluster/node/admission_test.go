package node

import (
	"fmt"
	"sync"
	"testing"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/supervisor"
)

// fakeStore is a store whose sandboxes a test adds, as a create that returned would.
type fakeStore struct {
	mu        sync.Mutex
	sandboxes []*supervisor.Status
}

func (f *fakeStore) list() ([]*supervisor.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*supervisor.Status(nil), f.sandboxes...), nil
}

func (f *fakeStore) add(id string, state supervisor.State, r supervisor.Resources) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes = append(f.sandboxes, &supervisor.Status{State: state, Config: store.Config{ID: id, Resources: r}})
}

// TestAdmissionConcurrentCreatesNeverPassTheLimit: 40 creates at once on a node of 7 slots
// (each, once admitted, lands in the store before it releases, as a real create does):
// exactly 7 pass and the others are refused node-full; none is counted twice (in the store
// and by its reservation), so a create after a release is admitted again.
func TestAdmissionConcurrentCreatesNeverPassTheLimit(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	a := NewAdmission(v1alpha1.Capacity{Sandboxes: 7, MemoryMB: 1 << 20, MilliCPU: 1 << 20}, fs.list)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, full := 0, 0
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("s-%d", i)
			release, err := a.Admit(id, supervisor.Resources{VCPUs: 1, MemoryMB: 64})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if errcode.Of(err) != errcode.NodeFull {
					t.Errorf("%s refused with %v, want node-full", id, err)
				}
				full++
				return
			}
			admitted++
			fs.add(id, supervisor.StateRunning, supervisor.Resources{VCPUs: 1, MemoryMB: 64})
			release()
		}()
	}
	wg.Wait()
	if admitted != 7 || full != 33 {
		t.Fatalf("admitted %d, refused %d: want 7 and 33", admitted, full)
	}
	if _, err := a.Admit("one-more", supervisor.Resources{}); errcode.Of(err) != errcode.NodeFull {
		t.Fatalf("an eighth create with the store full: %v, want node-full", err)
	}
}

// TestAdmissionDimensions: memory and CPU limits count for sandboxes that hold them (not a
// stopped one), a create in flight counts once even when its record is already in the
// store, and a draining node refuses all.
func TestAdmissionDimensions(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	a := NewAdmission(v1alpha1.Capacity{Sandboxes: 10, MemoryMB: 1000, MilliCPU: 4000}, fs.list)
	fs.add("stopped", supervisor.StateStopped, supervisor.Resources{VCPUs: 4, MemoryMB: 1000})
	fs.add("running", supervisor.StateRunning, supervisor.Resources{VCPUs: 1, MemoryMB: 400})
	release, err := a.Admit("big", supervisor.Resources{VCPUs: 1, MemoryMB: 500})
	if err != nil {
		t.Fatalf("500 MiB with 600 free: %v", err)
	}
	// Its record is in the store, provisioned, while it starts: still counted once, by the
	// reservation.
	fs.add("big", supervisor.StateProvisioned, supervisor.Resources{VCPUs: 1, MemoryMB: 500})
	if _, err := a.Admit("more", supervisor.Resources{VCPUs: 1, MemoryMB: 101}); errcode.Of(err) != errcode.NodeFull {
		t.Fatalf("101 MiB with 100 free: %v, want node-full", err)
	}
	r2, err := a.Admit("fits", supervisor.Resources{VCPUs: 1, MemoryMB: 100})
	if err != nil {
		t.Fatalf("100 MiB with 100 free: %v", err)
	}
	r2()
	if _, err := a.Admit("cpu", supervisor.Resources{VCPUs: 3, MemoryMB: 1}); errcode.Of(err) != errcode.NodeFull {
		t.Fatalf("3 vCPUs with 2 free: %v, want node-full", err)
	}
	release()
	a.SetDraining(true)
	if _, err := a.Admit("drained", supervisor.Resources{VCPUs: 1, MemoryMB: 1}); errcode.Of(err) != errcode.NodeDraining {
		t.Fatalf("a create on a draining node: %v, want node-draining", err)
	}
	// A start of a sandbox the node holds is no new sandbox: admitted while draining.
	if r, err := a.Admit("stopped", supervisor.Resources{VCPUs: 1, MemoryMB: 1}); err != nil {
		t.Fatalf("a start of a held sandbox while draining: %v", err)
	} else {
		r()
	}
	a.SetDraining(false)
	if r, err := a.Admit("back", supervisor.Resources{VCPUs: 1, MemoryMB: 1}); err != nil {
		t.Fatalf("a create once the drain is called off: %v", err)
	} else {
		r()
	}
}
