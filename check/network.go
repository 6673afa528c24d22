package check

import (
	"path/filepath"

	"github.com/sandboxd/sandboxd/network"
	"github.com/sandboxd/sandboxd/store"
)

// LeakedNetwork is a network resource (an address record, an interface, an nftables object)
// of a sandbox that is not running, or of none.
const LeakedNetwork = "leaked-network"

// Network is what the checker needs of a network.Manager.
type Network interface {
	Leftovers(live func(id string) bool) (network.Leftovers, error)
	Repair(l network.Leftovers) error
}

// networkLive says which sandboxes may own network resources: those running, those whose lock
// another process holds (a start may be making them), and those a runtime process names.
func (c *checker) networkLive(p *pass) func(id string) bool {
	procDirs := map[string]bool{}
	for _, pr := range p.procs {
		procDirs[pr.Dir] = true
	}
	return func(id string) bool {
		dir := filepath.Join(c.root, store.SandboxesDir, id)
		s := p.states[dir]
		return s != nil && (s.alive || s.busy) || procDirs[dir]
	}
}

// checkNetwork reports the network resources that no live sandbox owns.
func (c *checker) checkNetwork(p *pass) {
	if c.o.Network == nil {
		return
	}
	l, err := c.o.Network.Leftovers(c.networkLive(p))
	if err != nil {
		p.add(LeakedNetwork, "", "", "the sandbox networks could not be listed: %v", err)
		return
	}
	for _, id := range l.Records {
		p.add(LeakedNetwork, id, filepath.Join("network", id+".json"), "the network of a sandbox that is not running (its record, and what it names)")
	}
	orphans := network.Leftovers{Interfaces: l.Interfaces, Chains: l.Chains, Sets: l.Sets, Counters: l.Counters, Gateways: l.Gateways, Temp: l.Temp}
	if !orphans.Empty() {
		p.add(LeakedNetwork, "", "", "network objects that no record names: %s", orphans.String())
	}
}

// repairNetwork removes what checkNetwork reports, as listed again now: the first pass's
// list may be stale, and the repairs before it may have ended the processes (an interrupted
// start's, unrecorded ones) that made a sandbox's network look live.
func (c *checker) repairNetwork(p *pass) {
	if c.o.Network == nil {
		return
	}
	now := *p
	if procs, err := c.rt.Processes(c.root); err == nil {
		now.procs = procs
	}
	l, err := c.o.Network.Leftovers(c.networkLive(&now))
	if err == nil && !l.Empty() {
		err = c.o.Network.Repair(l)
	}
	if err != nil {
		c.o.Logger.Error("check: repair the sandbox networks", "err", err)
	}
}
