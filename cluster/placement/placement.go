// Package placement chooses the node a new sandbox goes to, from the nodes' published
// BothyNode status, and holds what it placed as reservations until the nodes' status
// accounts for it, so that creates placed between two status updates never overcommit a node
// (docs/cluster.md, "Placement"). It decides; it never talks to a node or the API server.
//
// # The rule
//
//  1. Eligible nodes: lease live, Healthy, neither cordoned nor draining, and with room for
//     the request in every dimension — memory and CPU (limits), and one sandbox slot — after
//     what the node publishes as allocated and what this placer has reserved on it that the
//     published status does not yet count.
//  2. Among them, a node that already holds the request's template generation, else its
//     image, is preferred: a clone or a start from a local image costs no copy or pull. A
//     request that names a template and no generation wants the template's current
//     generation: the newest (generation ids grow with each capture) that any live node
//     lists, cordoned or full ones included, since the node that captured it may be both.
//  3. Then the node left with the most room: the largest of the smallest fraction left in any
//     dimension (spreading, so no one dimension of one node runs out first).
//  4. Ties go to the name that sorts first, so the choice is deterministic.
//
// A reservation counts against its node from Place until the node's status, written after
// the create finished (Done), includes the sandbox; a failed create releases it at once.
package placement

import (
	"errors"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
)

// ErrNoNode is the answer when no node is eligible for the request.
var ErrNoNode = errors.New("placement: no live, healthy, uncordoned node has room for the sandbox")

// Node is what placement reads of one node.
type Node struct {
	Name string
	// Live says the node's lease is live by the placer's clock.
	Live   bool
	Spec   v1alpha1.BothyNodeSpec
	Status v1alpha1.BothyNodeStatus
}

// Request is what a create asks for.
type Request struct {
	MemoryMB, MilliCPU int64
	Image              string
	Template           string // with Generation, a clone's source
	Generation         string
}

// Reservation is one placed create.
type Reservation struct {
	p        *Placer
	node     string
	req      Request
	doneAt   time.Time // zero until Done
	released bool
}

// Node is the node the reservation is on.
func (r *Reservation) Node() string { return r.node }

// Done says the create on the node finished: the reservation stays until the node's status,
// written after now, counts the sandbox.
func (r *Reservation) Done(now time.Time) {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	r.doneAt = now
}

// Release drops the reservation at once: the create failed.
func (r *Reservation) Release() {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	if !r.released {
		r.released = true
		r.p.reserved[r.node] = slices.DeleteFunc(r.p.reserved[r.node], func(x *Reservation) bool { return x == r })
	}
}

// Placer places creates. It is safe for concurrent use.
type Placer struct {
	mu       sync.Mutex
	reserved map[string][]*Reservation
}

// New makes a Placer with no reservations.
func New() *Placer { return &Placer{reserved: map[string][]*Reservation{}} }

// Place chooses a node for req among nodes and reserves req's resources on it.
func (p *Placer) Place(nodes []Node, req Request) (*Reservation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	type candidate struct {
		name string
		// local is 4: lists the generation, 3: may hold it (its list is incomplete),
		// 2: lists the image, 1: may hold it, 0: none of these.
		local    int
		headroom float64
	}
	want := v1alpha1.Generation{Template: req.Template, Generation: req.Generation}
	if want.Template != "" && want.Generation == "" {
		want.Generation = CurrentGeneration(nodes, want.Template)
	}
	var cands []candidate
	for _, n := range nodes {
		p.expire(n)
		if !n.Live || n.Spec.Cordoned || n.Spec.Draining || n.Status.Health != v1alpha1.NodeHealthy {
			continue
		}
		free := p.free(n)
		if free.MemoryMB < req.MemoryMB || free.MilliCPU < req.MilliCPU || free.Sandboxes < 1 {
			continue
		}
		c := candidate{name: n.Name, headroom: headroom(n.Status.Capacity, free, req)}
		genWanted, imageWanted := want.Template != "" && want.Generation != "", req.Image != ""
		switch {
		case genWanted && slices.Contains(n.Status.Generations, want):
			c.local = 4
		case genWanted && n.Status.GenerationsIncomplete:
			c.local = 3
		case imageWanted && slices.Contains(n.Status.Images, req.Image):
			c.local = 2
		case imageWanted && n.Status.ImagesIncomplete:
			c.local = 1
		}
		cands = append(cands, c)
	}
	if len(cands) == 0 {
		return nil, ErrNoNode
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.local != b.local {
			return a.local > b.local
		}
		if a.headroom != b.headroom {
			return a.headroom > b.headroom
		}
		return a.name < b.name
	})
	r := &Reservation{p: p, node: cands[0].name, req: req}
	p.reserved[r.node] = append(p.reserved[r.node], r)
	return r, nil
}

// CurrentGeneration is the newest generation of tmpl that a live node among nodes lists, or
// "" when none lists one. Generation ids grow with each capture of a template, and a
// template is captured on one node of a cluster (the template registry refuses a second
// origin's generation of the same id), so the newest listed is the one its origin would
// clone now, unless the origin is lost.
func CurrentGeneration(nodes []Node, tmpl string) string {
	cur := ""
	for _, n := range nodes {
		if !n.Live {
			continue
		}
		for _, g := range n.Status.Generations {
			if g.Template == tmpl && newerGeneration(g.Generation, cur) {
				cur = g.Generation
			}
		}
	}
	return cur
}

// newerGeneration says whether generation id a is newer than b ("" being older than any).
// Ids are 'g' and a number zero-padded to six digits or more, without further leading zeros
// (store/template), so a longer id is a larger number, and ids of one length sort as text.
func newerGeneration(a, b string) bool {
	if len(a) != len(b) {
		return len(a) > len(b)
	}
	return a > b
}

// expire drops n's reservations that its status now counts: done before the status was
// written.
func (p *Placer) expire(n Node) {
	if n.Status.UpdatedAt == nil {
		return
	}
	updated := n.Status.UpdatedAt.Time
	p.reserved[n.Name] = slices.DeleteFunc(p.reserved[n.Name], func(r *Reservation) bool {
		if !r.doneAt.IsZero() && updated.After(r.doneAt) {
			r.released = true
			return true
		}
		return false
	})
}

// free is what n publishes as free less what is reserved on it.
func (p *Placer) free(n Node) v1alpha1.Capacity {
	f := n.Status.Free
	for _, r := range p.reserved[n.Name] {
		f.MemoryMB -= r.req.MemoryMB
		f.MilliCPU -= r.req.MilliCPU
		f.Sandboxes--
	}
	return f
}

// headroom is the smallest fraction of capacity left in any dimension once req is placed.
func headroom(capacity, free v1alpha1.Capacity, req Request) float64 {
	frac := func(left, total int64) float64 {
		if total <= 0 {
			return 0
		}
		return float64(left) / float64(total)
	}
	return min(
		frac(free.MemoryMB-req.MemoryMB, capacity.MemoryMB),
		frac(free.MilliCPU-req.MilliCPU, capacity.MilliCPU),
		frac(int64(free.Sandboxes)-1, int64(capacity.Sandboxes)),
	)
}
