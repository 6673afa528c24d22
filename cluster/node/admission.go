package node

import (
	"slices"
	"sync"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// Admission is the node's own enforcement of the capacity it publishes: the supervisor asks
// it before every create (supervisor.Options.CreateAdmission). Placement reserves per placer
// (a router replica, the controller), so two placers choosing one node at the same instant
// both see its room; the node is the one place where all its creates meet, so it is the one
// that can refuse the create that would take it past its limits (node-full), which a router
// then places on another node.
//
// Admit is atomic: under one lock it reads what the store holds, adds what the creates in
// flight have reserved, and reserves the new create, so N concurrent creates never pass the
// limits. A create in flight counts by its reservation, not by the store (whose record of it
// may be half made, or provisioned and not yet running, which Allocated does not count); its
// reservation ends when its create returns, and from then on the store holds it, or not.
//
// A draining node admits no create at all (node-draining, see drain.go); a start of a sandbox
// it holds is admitted by its limits alone.
type Admission struct {
	capacity v1alpha1.Capacity
	list     func() ([]*supervisor.Status, error)

	mu       sync.Mutex
	held     map[*reservation]struct{}
	draining bool
}

type reservation struct {
	id     string
	limits v1alpha1.Capacity
}

// NewAdmission makes the admission of a node offering capacity, whose sandboxes list reads.
func NewAdmission(capacity v1alpha1.Capacity, list func() ([]*supervisor.Status, error)) *Admission {
	return &Admission{capacity: capacity, list: list, held: map[*reservation]struct{}{}}
}

// Capacity is what the node offers, as published.
func (a *Admission) Capacity() v1alpha1.Capacity { return a.capacity }

// SetDraining makes the node refuse every create (true) or admit them again (false).
func (a *Admission) SetDraining(on bool) {
	a.mu.Lock()
	a.draining = on
	a.mu.Unlock()
}

// Admit reserves room for the sandbox id with limits, or refuses it: node-draining while
// the node drains, node-full when the slot, the memory or the CPU limits would pass the
// node's capacity. Release (once the create has returned) gives the reservation back.
func (a *Admission) Admit(id string, limits supervisor.Resources) (release func(), err error) {
	want := v1alpha1.Capacity{Sandboxes: 1, MemoryMB: int64(limits.MemoryMB), MilliCPU: int64(limits.VCPUs) * 1000}
	a.mu.Lock()
	defer a.mu.Unlock()
	sandboxes, err := a.list()
	if err != nil {
		return nil, err
	}
	// A drain refuses new sandboxes; a start of one the node holds is its owner's to make.
	if a.draining && !slices.ContainsFunc(sandboxes, func(st *supervisor.Status) bool { return st.Config.ID == id }) {
		return nil, errcode.New(errcode.NodeDraining, "This node is being drained and takes no new sandbox; create it through the cluster's router, which places it on another node.")
	}
	alloc := a.allocatedLocked(sandboxes)
	switch {
	case alloc.Sandboxes+want.Sandboxes > a.capacity.Sandboxes:
		return nil, a.full("sandbox slots", int64(alloc.Sandboxes), int64(a.capacity.Sandboxes), "", 1, "")
	case alloc.MemoryMB+want.MemoryMB > a.capacity.MemoryMB:
		return nil, a.full("memory limits", alloc.MemoryMB, a.capacity.MemoryMB, " MiB", want.MemoryMB, " MiB")
	case alloc.MilliCPU+want.MilliCPU > a.capacity.MilliCPU:
		return nil, a.full("CPU limits", alloc.MilliCPU, a.capacity.MilliCPU, " milli-CPU", want.MilliCPU, " milli-CPU")
	}
	r := &reservation{id: id, limits: want}
	a.held[r] = struct{}{}
	return func() {
		a.mu.Lock()
		delete(a.held, r)
		a.mu.Unlock()
	}, nil
}

func (a *Admission) full(what string, used, capacity int64, unit string, want int64, wantUnit string) error {
	return errcode.New(errcode.NodeFull, "This node has no room for the sandbox: %d%s of its %s are allocated out of %d%s, and the sandbox needs %d%s more. Create it through the cluster's router, which places it on another node, ask for less, or retry once sandboxes here end.", used, unit, what, capacity, unit, want, wantUnit)
}

// allocatedLocked is what the store's sandboxes hold (Allocated), but for those a create in
// flight holds, plus what every create in flight has reserved.
func (a *Admission) allocatedLocked(sandboxes []*supervisor.Status) v1alpha1.Capacity {
	inFlight := make(map[string]bool, len(a.held))
	var alloc v1alpha1.Capacity
	for r := range a.held {
		inFlight[r.id] = true
		alloc.Sandboxes += r.limits.Sandboxes
		alloc.MemoryMB += r.limits.MemoryMB
		alloc.MilliCPU += r.limits.MilliCPU
	}
	settled := sandboxes[:0:0]
	for _, st := range sandboxes {
		if !inFlight[st.Config.ID] {
			settled = append(settled, st)
		}
	}
	s := Allocated(settled)
	alloc.Sandboxes += s.Sandboxes
	alloc.MemoryMB += s.MemoryMB
	alloc.MilliCPU += s.MilliCPU
	return alloc
}
