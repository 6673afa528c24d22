package node

import (
	"testing"
	"time"

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
