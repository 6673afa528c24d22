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

// TestIncompleteListsArePossibleHolders: a node whose status lists only part of what it holds
// ranks below one that lists what the create wants and above one that surely lacks it,
// though the roomiest.
func TestIncompleteListsArePossibleHolders(t *testing.T) {
	t.Parallel()
	g1 := v1alpha1.Generation{Template: "py", Generation: "g000001"}
	lists, maybe, lacks := busy("lists"), busy("maybe"), node("lacks", 4096, 10)
	lists.Status.Free.MemoryMB, maybe.Status.Free.MemoryMB = 512, 1024
	tests := []struct {
		name string
		set  func(lists, maybe *Node)
		req  Request
	}{
		{"a generation", func(l, m *Node) {
			l.Status.Generations = []v1alpha1.Generation{g1}
			m.Status.GenerationsIncomplete = true
		}, Request{MemoryMB: 128, Template: "py", Generation: "g000001"}},
		{"an image", func(l, m *Node) {
			l.Status.Images = []string{"python"}
			m.Status.ImagesIncomplete = true
		}, Request{MemoryMB: 128, Image: "python"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, m := lists, maybe
			tt.set(&l, &m)
			if r, err := New().Place([]Node{l, m, lacks}, tt.req); err != nil || r.Node() != "lists" {
				t.Fatalf("got %v, %v; want the node that lists it", r, err)
			}
			if r, err := New().Place([]Node{m, lacks}, tt.req); err != nil || r.Node() != "maybe" {
				t.Fatalf("got %v, %v; want the node whose list is incomplete over the roomier one that lacks it", r, err)
			}
		})
	}
}

// TestPrefersTheTemplatesCurrentGeneration: a create that names a template and no
// generation prefers a node holding the template's current generation, the newest that a
// live node lists, over a roomier node, and over one holding an older generation.
func TestPrefersTheTemplatesCurrentGeneration(t *testing.T) {
	t.Parallel()
	gens := func(ids ...string) []v1alpha1.Generation {
		var out []v1alpha1.Generation
		for _, id := range ids {
			out = append(out, v1alpha1.Generation{Template: "py", Generation: id})
		}
		return out
	}
	tests := []struct {
		name  string
		req   Request
		nodes func() []Node
		want  string
	}{
		{name: "the holder over a roomier node", req: Request{MemoryMB: 128, Template: "py"}, nodes: func() []Node {
			a := busy("a")
			a.Status.Generations = gens("g000002", "g000001")
			return []Node{a, node("b", 4096, 10)}
		}, want: "a"},
		{name: "the current generation over an older one", req: Request{MemoryMB: 128, Template: "py"}, nodes: func() []Node {
			a, b := busy("a"), node("b", 4096, 10)
			a.Status.Generations = gens("g000002")
			b.Status.Generations = gens("g000001")
			return []Node{a, b}
		}, want: "a"},
		{name: "ids compare as numbers", req: Request{MemoryMB: 128, Template: "py"}, nodes: func() []Node {
			a, b := busy("a"), node("b", 4096, 10)
			a.Status.Generations = gens("g1000000")
			b.Status.Generations = gens("g999999")
			return []Node{a, b}
		}, want: "a"},
		{name: "a named older generation", req: Request{MemoryMB: 128, Template: "py", Generation: "g000001"}, nodes: func() []Node {
			a, b := node("a", 4096, 10), busy("b")
			a.Status.Generations = gens("g000002")
			b.Status.Generations = gens("g000001")
			return []Node{a, b}
		}, want: "b"},
		{name: "a cordoned origin names the current generation but takes nothing", req: Request{MemoryMB: 128, Template: "py"}, nodes: func() []Node {
			a, b, c := node("a", 4096, 10), node("b", 4096, 10), busy("c")
			a.Spec.Cordoned = true
			a.Status.Generations = gens("g000002")
			b.Status.Generations = gens("g000001") // not the current one: no preference
			c.Status.Generations = gens("g000002")
			return []Node{a, b, c}
		}, want: "c"},
		{name: "a lost node's list does not count", req: Request{MemoryMB: 128, Template: "py"}, nodes: func() []Node {
			a, b := node("a", 4096, 10), busy("b")
			a.Live = false
			a.Status.Generations = gens("g000003")
			b.Status.Generations = gens("g000002")
			return []Node{a, b, node("c", 4096, 10)}
		}, want: "b"},
		{name: "no node holds the template: the most room", req: Request{MemoryMB: 128, Template: "py"}, nodes: func() []Node {
			return []Node{busy("a"), node("b", 4096, 10)}
		}, want: "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := New().Place(tt.nodes(), tt.req)
			if err != nil || r.Node() != tt.want {
				t.Fatalf("got %v, %v; want %s", r, err, tt.want)
			}
		})
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
