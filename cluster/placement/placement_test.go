package placement

import (
	"errors"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

func node(name string, memMB int64, slots int32) Node {
	c := v1alpha1.Capacity{MemoryMB: memMB, MilliCPU: 4000, Sandboxes: slots}
	return Node{Name: name, Live: true, Status: v1alpha1.BothyNodeStatus{Capacity: c, Free: c, Health: v1alpha1.NodeHealthy}}
}

// busy is a node with three quarters of its memory allocated: one that placement would pass
// over for an idle node("b", 4096, 10), unless that one is not eligible.
func busy(name string) Node {
	n := node(name, 4096, 10)
	n.Status.Free.MemoryMB = 1024
	return n
}

func TestPlaceChooses(t *testing.T) {
	t.Parallel()
	req := Request{MemoryMB: 256, MilliCPU: 1000, Image: "python"}
	tests := []struct {
		name  string
		nodes func() []Node
		want  string // "" for ErrNoNode
	}{
		{name: "most room", nodes: func() []Node {
			a := node("a", 4096, 10)
			a.Status.Free.MemoryMB = 1024 // three quarters allocated
			return []Node{a, node("b", 4096, 10)}
		}, want: "b"},
		{name: "the scarcest dimension decides", nodes: func() []Node {
			a := node("a", 4096, 10)
			a.Status.Free.Sandboxes = 2 // memory to spare, slots nearly gone
			b := node("b", 4096, 10)
			b.Status.Free.MemoryMB = 2048
			return []Node{a, b}
		}, want: "b"},
		{name: "tie by name", nodes: func() []Node { return []Node{node("b", 1024, 10), node("a", 1024, 10)} }, want: "a"},
		{name: "skips cordoned", nodes: func() []Node {
			b := node("b", 4096, 10)
			b.Spec.Cordoned = true
			return []Node{busy("a"), b}
		}, want: "a"},
		{name: "skips draining", nodes: func() []Node {
			b := node("b", 4096, 10)
			b.Spec.Draining = true
			return []Node{busy("a"), b}
		}, want: "a"},
		{name: "skips a lapsed lease", nodes: func() []Node {
			b := node("b", 4096, 10)
			b.Live = false
			return []Node{busy("a"), b}
		}, want: "a"},
		{name: "skips unhealthy", nodes: func() []Node {
			b := node("b", 4096, 10)
			b.Status.Health = v1alpha1.NodeDegraded
			return []Node{busy("a"), b}
		}, want: "a"},
		{name: "prefers the image", nodes: func() []Node {
			a := busy("a")
			a.Status.Images = []string{"python"}
			return []Node{a, node("b", 4096, 10)}
		}, want: "a"},
		{name: "no memory", nodes: func() []Node { return []Node{node("a", 128, 10)} }},
		{name: "no slot", nodes: func() []Node { return []Node{node("a", 4096, 0)} }},
		{name: "none", nodes: func() []Node { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := New().Place(tt.nodes(), req)
			if tt.want == "" {
				if !errors.Is(err, ErrNoNode) {
					t.Fatalf("got %v, want ErrNoNode", err)
				}
				return
			}
			if err != nil || r.Node() != tt.want {
				t.Fatalf("got %v %v, want %s", r, err, tt.want)
			}
		})
	}
}

func TestPrefersTheGeneration(t *testing.T) {
	t.Parallel()
	a, b := busy("a"), node("b", 4096, 10)
	a.Status.Generations = []v1alpha1.Generation{{Template: "py", Generation: "g1"}}
	b.Status.Images = []string{"python"}
	r, err := New().Place([]Node{a, b}, Request{MemoryMB: 128, Image: "python", Template: "py", Generation: "g1"})
	if err != nil || r.Node() != "a" {
		t.Fatalf("got %v, %v; want a, which holds the generation", r, err)
	}
}

// TestConcurrentCreatesNeverOvercommit: many creates placed at once, before any node's
// status changes, fill each node exactly to its slots and then find no node.
func TestConcurrentCreatesNeverOvercommit(t *testing.T) {
	t.Parallel()
	p := New()
	nodes := []Node{node("a", 1<<20, 7), node("b", 1<<20, 5), node("c", 1<<20, 3)}
	var mu sync.Mutex
	per := map[string]int{}
	refused := 0
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := p.Place(nodes, Request{MemoryMB: 64})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused++
				return
			}
			per[r.Node()]++
		}()
	}
	wg.Wait()
	if per["a"] != 7 || per["b"] != 5 || per["c"] != 3 || refused != 5 {
		t.Fatalf("placed %v, refused %d; want a=7 b=5 c=3 and 5 refused", per, refused)
	}
}

// TestReservationLifetime: a reservation counts until a status written after its create
// finished; a released one stops counting at once.
func TestReservationLifetime(t *testing.T) {
	t.Parallel()
	p := New()
	n := node("a", 1<<20, 1)
	r, err := p.Place([]Node{n}, Request{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Place([]Node{n}, Request{}); !errors.Is(err, ErrNoNode) {
		t.Fatalf("a second create on a node with one slot: %v, want ErrNoNode", err)
	}
	r.Release()
	r2, err := p.Place([]Node{n}, Request{})
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	done := time.Now()
	r2.Done(done)
	// A status written before the create finished does not count it yet.
	before := metav1.NewMicroTime(done.Add(-time.Second))
	n.Status.UpdatedAt = &before
	if _, err := p.Place([]Node{n}, Request{}); !errors.Is(err, ErrNoNode) {
		t.Fatalf("with a stale status: %v, want ErrNoNode", err)
	}
	// A status written after it counts the sandbox itself: the reservation goes, and the
	// published free (none left) decides.
	after := metav1.NewMicroTime(done.Add(time.Second))
	n.Status.UpdatedAt = &after
	n.Status.Free.Sandboxes = 0
	if _, err := p.Place([]Node{n}, Request{}); !errors.Is(err, ErrNoNode) {
		t.Fatalf("with the node full: %v, want ErrNoNode", err)
	}
	n.Status.Free.Sandboxes = 1 // the sandbox was deleted since
	if _, err := p.Place([]Node{n}, Request{}); err != nil {
		t.Fatalf("with the reservation expired and a slot free: %v", err)
	}
}
