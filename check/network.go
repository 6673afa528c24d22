package check

import (
	"context"
	"path/filepath"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/store"
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
	orphans := network.Leftovers{Interfaces: l.Interfaces, Chains: l.Chains, Sets: l.Sets, Counters: l.Counters, Gateways: l.Gateways,
		Intercepts: l.Intercepts, Temp: l.Temp}
	if !orphans.Empty() {
		p.add(LeakedNetwork, "", "", "network objects that no record names: %s", orphans.String())
	}
}

// repairNetwork removes what checkNetwork reports, as judged again now: the repairs before
// it (the supervisor's reconciliation, the kills) may have ended the processes that made a
// sandbox's network look live to the first pass, and a sandbox may have ended on its own
// since; the first pass's view of either would keep a record that nothing else removes (a
// sandbox that does not run has no launch left whose end tears its network down). A record is
// torn down under its sandbox's lifecycle lock, after a last look that the sandbox does not
// run; objects that no record names have no sandbox to lock and are removed as listed.
func (c *checker) repairNetwork(p *pass) {
	if c.o.Network == nil {
		return
	}
	log := c.o.Logger
	now := pass{}
	err := c.listProcesses(&now)
	procs := now.procs
	if err != nil {
		log.Error("check: repair the sandbox networks: list runtime processes", "err", err)
		return
	}
	procDirs := map[string]bool{}
	for _, pr := range procs {
		procDirs[pr.Dir] = true
	}
	l, err := c.o.Network.Leftovers(func(id string) bool { return procDirs[c.sandboxDir(id)] || c.runsNow(id) })
	if err != nil {
		log.Error("check: repair the sandbox networks", "err", err)
		return
	}
	for _, id := range l.Records {
		if err := c.repairNetworkRecord(id, procDirs); err != nil {
			log.Error("check: repair the network of a sandbox", "sandbox", id, "err", err)
		}
	}
	orphans := l
	orphans.Records = nil
	if !orphans.Empty() {
		if err := c.o.Network.Repair(orphans); err != nil {
			log.Error("check: repair the sandbox networks", "err", err)
		}
	}
}

func (c *checker) sandboxDir(id string) string { return filepath.Join(c.root, store.SandboxesDir, id) }

// runsNow reports whether sandbox id may own its network now, without its lock: another
// process holds the lock (a start may be making the network), or its runtime record names a
// live process.
func (c *checker) runsNow(id string) bool {
	dir, err := platform.OpenDir(c.sandboxDir(id))
	if err != nil {
		return false // no state directory: no sandbox, no transition
	}
	defer dir.Close()
	s := &sandboxState{id: id}
	if lf := tryLock(dir, s); lf != nil {
		lf.Close()
	}
	if s.busy {
		return true
	}
	rec, err := c.st.ReadRuntimeRecordUnlocked(id)
	if errcode.Of(err) == errcode.SandboxNotFound {
		return false // removed meanwhile
	}
	// A record that does not read is reported on its own; its network is kept until it does.
	return err != nil || rec != nil && platformID(rec).Alive()
}

// repairNetworkRecord tears down the recorded network of sandbox id under its lifecycle lock,
// taken as a provision takes it, so that it is held also for an id without a sandbox: no
// start can make a network for the sandbox meanwhile. A sandbox that runs after all keeps it.
func (c *checker) repairNetworkRecord(id string, procDirs map[string]bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.LockTimeout)
	defer cancel()
	l, err := c.st.LockForProvision(ctx, id)
	if err != nil {
		return err
	}
	defer l.Unlock()
	rec, err := l.RuntimeRecord()
	if err != nil {
		return err
	}
	if rec != nil && platformID(rec).Alive() || procDirs[c.sandboxDir(id)] {
		return nil
	}
	return c.o.Network.Repair(network.Leftovers{Records: []string{id}})
}
