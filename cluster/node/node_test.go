package node

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/supervisor"
)

func TestAllocated(t *testing.T) {
	t.Parallel()
	sb := func(state supervisor.State, vcpus, mem int) *supervisor.Status {
		return &supervisor.Status{State: state, Config: store.Config{Resources: store.Resources{VCPUs: vcpus, MemoryMB: mem}}}
	}
	tests := []struct {
		name      string
		sandboxes []*supervisor.Status
		want      v1alpha1.Capacity
	}{
		{name: "none"},
		{
			name:      "running and paused hold their limits",
			sandboxes: []*supervisor.Status{sb(supervisor.StateRunning, 1, 512), sb(supervisor.StatePaused, 2, 256)},
			want:      v1alpha1.Capacity{MemoryMB: 768, MilliCPU: 3000, Sandboxes: 2},
		},
		{
			name:      "stopped and provisioned hold a slot alone",
			sandboxes: []*supervisor.Status{sb(supervisor.StateStopped, 1, 512), sb(supervisor.StateProvisioned, 1, 512), sb(supervisor.StateStarting, 1, 128)},
			want:      v1alpha1.Capacity{MemoryMB: 128, MilliCPU: 1000, Sandboxes: 3},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Allocated(tt.sandboxes); got != tt.want {
				t.Fatalf("Allocated = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestFreeNeverNegative(t *testing.T) {
	t.Parallel()
	got := free(v1alpha1.Capacity{MemoryMB: 1024, MilliCPU: 2000, Sandboxes: 2}, v1alpha1.Capacity{MemoryMB: 2048, MilliCPU: 1000, Sandboxes: 3})
	if want := (v1alpha1.Capacity{MemoryMB: 0, MilliCPU: 1000, Sandboxes: 0}); got != want {
		t.Fatalf("free = %+v, want %+v", got, want)
	}
}

func TestLeaseLive(t *testing.T) {
	t.Parallel()
	renew := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		now  time.Time
		want bool
	}{
		{"just renewed", renew, true},
		{"inside the duration", renew.Add(14 * time.Second), true},
		{"at the end", renew.Add(15 * time.Second), false},
		{"after", renew.Add(time.Minute), false},
	}
	for _, tt := range tests {
		if got := LeaseLive(renew, 15*time.Second, tt.now); got != tt.want {
			t.Errorf("%s: LeaseLive = %v, want %v", tt.name, got, tt.want)
		}
	}
	if LeaseLive(time.Time{}, 15*time.Second, renew) {
		t.Error("a lease never renewed reads live")
	}
}

// TestStatusNamesTheProcess: each process of a node publishes a start id of its own, the one
// its lease carries (StartLabel), so a router can tell a restarted node's status from the
// last process's.
func TestStatusNamesTheProcess(t *testing.T) {
	t.Parallel()
	ids := map[string]bool{}
	for range 2 {
		n, err := New(Config{Rest: &rest.Config{Host: "http://127.0.0.1:1"}, Name: "n", Namespace: "ns", Sandboxes: noSandboxes{}})
		if err != nil {
			t.Fatal(err)
		}
		st, err := n.Status()
		if err != nil {
			t.Fatal(err)
		}
		if st.StartID == "" || st.StartID != n.startID || len(st.StartID) > 63 {
			t.Fatalf("status start id %q, process %q", st.StartID, n.startID)
		}
		ids[st.StartID] = true
	}
	if len(ids) != 2 {
		t.Fatal("two processes of a node published one start id")
	}
}

type noSandboxes struct{}

func (noSandboxes) List() ([]*supervisor.Status, error) { return nil, nil }
func (noSandboxes) Status(string) (*supervisor.Status, error) {
	return nil, errors.New("no sandboxes")
}

// TestStatusSaysItsListsAreIncomplete: a node holding more images or generations than the
// status lists says so, and lists the newest generations; one within the bound does not.
func TestStatusSaysItsListsAreIncomplete(t *testing.T) {
	t.Parallel()
	for _, held := range []int{maxListed, maxListed + 1} {
		images := make([]string, held)
		gens := make([]v1alpha1.Generation, held)
		for i := range held {
			images[i] = fmt.Sprintf("image-%d", i)
			gens[i] = v1alpha1.Generation{Template: "t", Generation: fmt.Sprintf("g%06d", held-i)} // newest first
		}
		n, err := New(Config{Rest: &rest.Config{Host: "http://127.0.0.1:1"}, Name: "n", Namespace: "ns", Sandboxes: noSandboxes{},
			Images: func() []string { return images }, Generations: func() []v1alpha1.Generation { return gens }})
		if err != nil {
			t.Fatal(err)
		}
		st, err := n.Status()
		if err != nil {
			t.Fatal(err)
		}
		over := held > maxListed
		if st.ImagesIncomplete != over || st.GenerationsIncomplete != over || len(st.Images) != min(held, maxListed) || len(st.Generations) != min(held, maxListed) {
			t.Fatalf("holding %d: %d images listed (incomplete %v), %d generations (incomplete %v)", held, len(st.Images), st.ImagesIncomplete, len(st.Generations), st.GenerationsIncomplete)
		}
		if st.Generations[0] != gens[0] {
			t.Fatalf("holding %d: the first generation listed is %v, want the newest %v", held, st.Generations[0], gens[0])
		}
	}
}
