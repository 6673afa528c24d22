package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// A sandbox's network follows its launch (see the network package for what is made):
//
//   - Start: once the agent answers (the init, and so the sandbox's network namespace, exist),
//     and before the launch commits, [Supervisor.attachNetwork] sets the network up and
//     points the sandbox's /etc/resolv.conf at its gateway's resolver. A failure abandons the
//     launch, whose endLaunch tears the network down.
//   - Every end of a launch (a stop, an exit noticed, an abandoned or interrupted start) and a
//     delete calls [Supervisor.detachNetwork], which tears down from the Manager's record, so
//     that what a crashed bothyd made goes too.
//   - Reattach of a running sandbox that this process has not attached (after a restart of
//     bothyd) sets it up again ([Supervisor.adoptNetwork]): the Manager keeps the veth and
//     re-arms the resolver, which lived in the old process.
//   - A resume of a microVM whose memory was released joins the network to the guest of its
//     new QEMU ([Supervisor.rejoinNetwork]); the network itself stayed (the shim keeps the
//     namespace). A restore of a memory generation has the generation's NIC, whatever the
//     policy: a clone without a network takes its guest's down ([Supervisor.dropRestoredNetwork]),
//     a networked one of a generation without one is refused ([Supervisor.restoreNIC]).
//   - Start-up ([Supervisor.ReattachAll]) then tears down the network of every recorded
//     sandbox that does not run ([Supervisor.reconcileNetworks]): a record can outlive its
//     launch when the reconciliation that ended the launch had no Manager (`bothyd check
//     --repair`'s) or its Teardown failed, and afterwards no launch is left whose end would
//     look at it again.
//
// The policy is the sandbox's configuration record's (store.Config.Network), so that a live
// change ([Supervisor.SetNetwork]) outlives restarts of both.

// Networker is what the supervisor needs of a network.Manager.
type Networker interface {
	Setup(id string, target network.Target, rules *network.Rules) (network.Attachment, error)
	Update(id string, rules *network.Rules) error
	Teardown(id string) error
	// Recorded lists the sandboxes whose network has a record, set up by any process.
	Recorded() ([]string, error)
}

// NetworkPolicy is a sandbox's egress policy, as the API carries it.
type NetworkPolicy = store.NetworkPolicy

// NetworkStatus is a sandbox's network as [Status] shows it.
type NetworkStatus struct {
	Policy NetworkPolicy
	// Address is the sandbox's own address, while it runs with an interface.
	Address netip.Addr
}

// netState is the supervisor's view of the sandboxes it attached.
type netState struct {
	mgr Networker

	mu       sync.Mutex
	attached map[string]network.Attachment // by sandbox id
}

func newNetState(mgr Networker) *netState {
	return &netState{mgr: mgr, attached: map[string]network.Attachment{}}
}

func (n *netState) get(id string) (network.Attachment, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	a, ok := n.attached[id]
	return a, ok
}

func (n *netState) set(id string, a network.Attachment) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.attached[id] = a
}

func (n *netState) forget(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.attached, id)
}

// parseNetwork validates a policy: its entries (the error names the first bad one, as
// network.allow[2]), and, when it asks for any destination, that this server can give one.
func (s *Supervisor) parseNetwork(p *NetworkPolicy) (*network.Rules, error) {
	if p == nil {
		return &network.Rules{}, nil
	}
	rules, err := network.Parse(network.Policy{Internet: p.Internet, Allow: p.Allow, Deny: p.Deny, Secrets: bindingsOf(p.Secrets)})
	if err != nil {
		return nil, err
	}
	if !rules.Networked() {
		return rules, nil
	}
	if s.net.mgr == nil {
		return nil, errcode.New(errcode.Unavailable, "This bothyd gives sandboxes no network; leave out network, or ask the operator to run it as root on Linux.")
	}
	if _, ok := s.rt.(runtime.NetNSer); !ok {
		return nil, errcode.New(errcode.Unavailable, "The %s runtime cannot give a sandbox a network interface; leave out network.", s.rt.Kind())
	}
	return rules, nil
}

// checkNetwork validates a create request's policy, and that the secrets it binds exist.
func (s *Supervisor) checkNetwork(p *NetworkPolicy) error {
	rules, err := s.parseNetwork(p)
	if err != nil {
		return err
	}
	return s.checkSecrets(rules)
}

// rulesOf parses a recorded policy. A record that no longer parses (written by another build)
// gives no network rather than a wider one.
func (s *Supervisor) rulesOf(cfg *store.Config) *network.Rules {
	rules, err := s.parseNetwork(cfg.Network)
	if err != nil {
		s.log.Warn("network: the recorded policy is refused; the sandbox gets no network", "sandbox", cfg.ID, "err", err)
		return &network.Rules{}
	}
	return rules
}

// networked says whether cfg's sandbox gets a network interface from this server.
func (s *Supervisor) networked(cfg *store.Config) bool {
	return s.net.mgr != nil && s.rulesOf(cfg).Networked()
}

// restoreNIC reports whether the restore of the memory generation in genDir by rt (a
// [runtime.MemoryCapturer]) gives the guest a NIC: the saved devices say so
// ([runtime.SavedNICer]), whatever cfg's policy, since a saved state loads only into the
// devices it was saved from. A networked sandbox cannot restore a generation without one
// (no hot-plug): that is refused, before anything is made.
func (s *Supervisor) restoreNIC(rt runtime.Runtime, cfg *store.Config, genDir string) (bool, error) {
	nic := false
	if sn, ok := rt.(runtime.SavedNICer); ok {
		var err error
		if nic, err = sn.SavedNIC(genDir); err != nil {
			return false, err
		}
	}
	if !nic && s.networked(cfg) {
		return false, errcode.New(errcode.Unavailable,
			"Sandbox %s has a network policy, but its memory generation was captured from a microVM without a network interface, which a restore cannot add (no hot-plug); clone it without network (or set the network to {} while it is stopped), or clone a generation captured from a microVM started with a network.", cfg.ID)
	}
	return nic, nil
}

// dropRestoredNetwork takes down the NIC of a guest restored, with its source's address, from
// a generation saved with one, for a clone without a network: its QEMU is in a network
// namespace of its own with nothing attached, so nothing leaves it either way, and the guest
// keeps nothing of its source's network identity. An agent that cannot (one of a build
// before the down form, in an older generation's memory) fails the launch.
func (s *Supervisor) dropRestoredNetwork(ctx context.Context, cfg *store.Config, client *control.Client) error {
	if !slices.Contains(client.Features(), control.FeatureNetworkDown) {
		return errcode.New(errcode.Unavailable, "Sandbox %s restores a guest with its source's network interface, whose agent (%s) cannot take it down; clone it with a network, or capture a new generation.", cfg.ID, client.AgentVersion())
	}
	if err := client.DropNetwork(ctx); err != nil {
		return errcode.Wrap(errcode.Unavailable, err, "Sandbox %s could not take down the network interface of its restored guest: %v.", cfg.ID, err)
	}
	return nil
}

// openNetNS opens the network namespace of the sandbox whose runtime process is proc: its
// init's, found by the runtime, and checked after the open to be still that process's child,
// so that a pid reused meanwhile is never taken for the init.
func (s *Supervisor) openNetNS(rt runtime.Runtime, dir string, proc platform.ProcessID) (*os.File, error) {
	nr, ok := rt.(runtime.NetNSer)
	if !ok {
		return nil, fmt.Errorf("the %s runtime gives sandboxes no network namespace of their own", rt.Kind())
	}
	pid, err := nr.NetNS(dir)
	if err != nil {
		return nil, err
	}
	ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return nil, fmt.Errorf("opening the network namespace of the sandbox's init: %w", err)
	}
	if ppid, err := platform.ParentPid(pid); err != nil || ppid != proc.Pid || !proc.Alive() {
		ns.Close()
		return nil, errors.New("the sandbox's init ended while its network namespace was opened")
	}
	return ns, nil
}

// attachNetwork gives a launch that is coming up (its agent answers on client) the network
// its policy asks for, and points its resolver at the gateway. It does nothing for a policy
// that allows nothing. On failure the caller abandons the launch, which tears down what was
// made.
func (s *Supervisor) attachNetwork(ctx context.Context, l *store.Lock, cfg *store.Config, proc platform.ProcessID, client *control.Client) error {
	rules := s.rulesOf(cfg)
	if !rules.Networked() || s.net.mgr == nil {
		return nil
	}
	att, err := s.setupNetwork(l, rules, proc)
	if err != nil {
		return errcode.Wrap(errcode.Unavailable, err, "Sandbox %s could not get its network: %v.", cfg.ID, err)
	}
	if rt, err := s.runtimeFor(cfg); err == nil {
		if _, ok := rt.(runtime.GuestNetworker); ok {
			// The guest's NIC, not the namespace's eth0, holds the sandbox's address.
			if err := client.ConfigureNetwork(ctx, netip.PrefixFrom(att.Address, att.Subnet.Bits()), att.Gateway); err != nil {
				return errcode.Wrap(errcode.Unavailable, err, "Sandbox %s could not configure its network interface: %v.", cfg.ID, err)
			}
		}
	}
	// Written as root through the agent, over whatever the image has: the sandbox's own layer
	// takes it, and the sandbox may change it later like any file of its own.
	conf := "nameserver " + att.Gateway.String() + "\noptions edns0\n"
	req := control.WriteRequest{Path: "/etc/resolv.conf", User: "root", Mode: 0o644}
	if _, err := client.WriteFile(ctx, req, strings.NewReader(conf)); err != nil {
		return errcode.Wrap(errcode.Unavailable, err, "Sandbox %s could not be given its resolver: %v.", cfg.ID, err)
	}
	if len(rules.Secrets) > 0 {
		if err := s.installCA(ctx, client); err != nil {
			return errcode.Wrap(errcode.Unavailable, err, "Sandbox %s could not be given the egress proxy's CA: %v.", cfg.ID, err)
		}
	}
	return nil
}

// attachLaunchNetwork is attachNetwork for a launch that has not committed: a failure because
// the sandbox ended meanwhile (a killed init, a killed runtime process, and so an agent that
// hung up) is a start that did not come up, as one that ends before its agent answers is, not
// a network that is unavailable.
func (s *Supervisor) attachLaunchNetwork(ctx context.Context, l *store.Lock, cfg *store.Config, proc platform.ProcessID, client *control.Client) error {
	err := s.attachNetwork(ctx, l, cfg, proc, client)
	if err != nil && (agentGone(client) || s.launchEnded(l, proc)) {
		return errcode.Wrap(errcode.StartTimeout, err,
			"Sandbox %s did not come up: it exited while its network was set up (%v). The end of its log:\n%s", cfg.ID, err, s.logTail(l.Dir(), 20))
	}
	return err
}

// agentGone reports whether the agent's connection has closed.
func agentGone(client *control.Client) bool {
	select {
	case <-client.Done():
		return true
	default:
		return false
	}
}

// launchEnded reports whether the launch of proc has ended: its runtime process exited, or
// its init did.
func (s *Supervisor) launchEnded(l *store.Lock, proc platform.ProcessID) bool {
	if !proc.Alive() {
		return true
	}
	rt, err := s.lockedRuntime(l)
	if err != nil {
		return false
	}
	nr, ok := rt.(runtime.NetNSer)
	if !ok {
		return false
	}
	pid, err := nr.NetNS(l.Dir())
	if err != nil {
		return true
	}
	ppid, err := platform.ParentPid(pid)
	return err != nil || ppid != proc.Pid
}

// setupNetwork runs the Manager's Setup for the launch of proc and records the attachment.
func (s *Supervisor) setupNetwork(l *store.Lock, rules *network.Rules, proc platform.ProcessID) (network.Attachment, error) {
	return s.setupNetworkAs(l, rules, proc, false)
}

// setupNetworkAs is setupNetwork for a sandbox that ran networked under an earlier bothyd when
// adopt is set: what its resolver pinned and intercepted then is kept
// ([network.Target].Adopt).
func (s *Supervisor) setupNetworkAs(l *store.Lock, rules *network.Rules, proc platform.ProcessID, adopt bool) (network.Attachment, error) {
	rt, err := s.lockedRuntime(l)
	if err != nil {
		return network.Attachment{}, err
	}
	ns, err := s.openNetNS(rt, l.Dir(), proc)
	if err != nil {
		return network.Attachment{}, err
	}
	defer ns.Close()
	start := time.Now()
	att, err := s.net.mgr.Setup(l.ID(), network.Target{NS: ns, Adopt: adopt}, rules)
	if err != nil {
		return att, err
	}
	if gn, ok := rt.(runtime.GuestNetworker); ok {
		if err := gn.JoinGuest(ns); err != nil {
			return att, err
		}
	}
	s.net.set(l.ID(), att)
	s.log.Debug("network: attached", "sandbox", l.ID(), "address", att.Address, "took", time.Since(start))
	return att, nil
}

// adoptNetwork takes over the network of a running sandbox that this process has not
// attached: after a restart of bothyd, its filter and interface are still there, and its
// resolver, which ran in the old process, is started again. A failure is logged: the sandbox
// runs on, without name resolution, until a later reattach or a restart of it. A microVM
// whose memory is released has no QEMU, and so no guest to join: its resume adopts it
// ([Supervisor.rejoinNetwork]).
func (s *Supervisor) adoptNetwork(l *store.Lock, rec *store.RuntimeRecord) {
	if s.net.mgr == nil {
		return
	}
	if _, ok := s.net.get(l.ID()); ok {
		return
	}
	if pr, err := readPause(l.Dir()); err == nil && pr != nil && pr.LaunchID == rec.LaunchID && pr.Memory == MemoryReleased {
		return
	}
	cfg, err := l.Config()
	if err != nil || cfg == nil {
		return
	}
	rules := s.rulesOf(cfg)
	if !rules.Networked() {
		return
	}
	if _, err := s.setupNetworkAs(l, rules, processOf(rec), true); err != nil {
		if s.releasedVM(l) {
			// A resume that bothyd's death interrupted before its thaw: start-up's
			// reconciliation restores it, and its network pass adopts it then.
			s.log.Info("network: the sandbox's memory is released; its network is adopted once it is restored", "sandbox", l.ID())
			return
		}
		s.log.Error("network: re-adopting a running sandbox's network", "sandbox", l.ID(), "err", err)
	}
}

// releasedVM reports whether the sandbox l locks is a VM whose memory is released (its
// runtime reads it frozen with no QEMU to join), whatever its pause record says.
func (s *Supervisor) releasedVM(l *store.Lock) bool {
	rt, err := s.lockedRuntime(l)
	if err != nil {
		return false
	}
	p, ok := rt.(runtime.Pauser)
	if _, releases := rt.(runtime.MemoryReleaser); !ok || !releases {
		return false
	}
	frozen, err := p.Frozen(l.ID(), l.Dir())
	return err == nil && frozen
}

// rejoinNetwork joins a running microVM's network to its guest again once its released memory
// is restored: the network namespace, its eth0 and the host's side stayed (the shim keeps the
// namespace), but the restore's QEMU made a new tap, to which JoinGuest points the redirect.
// The guest keeps its address, and the gateway its MAC. A sandbox that this process has not
// attached (bothyd restarted while the memory was released) is adopted whole: Setup, which
// re-arms its resolver, and the join. It does nothing for a runtime without a guest's NIC or a
// sandbox without a network.
func (s *Supervisor) rejoinNetwork(l *store.Lock, rec *store.RuntimeRecord) error {
	if s.net.mgr == nil {
		return nil
	}
	rt, err := s.lockedRuntime(l)
	if err != nil {
		return err
	}
	gn, ok := rt.(runtime.GuestNetworker)
	if !ok {
		return nil
	}
	if _, ok := s.net.get(l.ID()); !ok {
		cfg, err := l.Config()
		if err != nil {
			return err
		}
		rules := s.rulesOf(cfg)
		if !rules.Networked() {
			return nil
		}
		_, err = s.setupNetworkAs(l, rules, processOf(rec), true)
		return err
	}
	ns, err := s.openNetNS(rt, l.Dir(), processOf(rec))
	if err != nil {
		return err
	}
	defer ns.Close()
	return gn.JoinGuest(ns)
}

// detachNetwork tears down a sandbox's network, from the Manager's record, whether this
// process made it or not. A failure is logged: `bothyd check --repair` removes what is left.
func (s *Supervisor) detachNetwork(id string) {
	if s.net.mgr == nil {
		return
	}
	s.net.forget(id)
	if err := s.net.mgr.Teardown(id); err != nil {
		s.log.Error("network: tearing down a sandbox's network", "sandbox", id, "err", err)
	}
}

// SetNetwork replaces a sandbox's egress policy. It is recorded, so that the next start
// applies it, and applied at once to a sandbox that runs: new connections follow it, and a
// sandbox that had no interface gets one.
func (s *Supervisor) SetNetwork(ctx context.Context, id string, p NetworkPolicy) (_ *Status, err error) {
	defer s.observe("network", time.Now(), &err)
	rules, err := s.parseNetwork(&p)
	if err != nil {
		return nil, err
	}
	if err := s.checkSecrets(rules); err != nil {
		return nil, err
	}
	l, cfg, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(l)
	if err := s.checkNetworkRuntime(cfg.Runtime, rules); err != nil {
		return nil, err
	}
	r, err := s.reattach(ctx, l)
	if err != nil {
		return nil, err
	}
	if r.mismatch {
		return nil, mismatchError(id)
	}
	if r.drivable() {
		if err := s.checkLiveNetwork(l, cfg, rules); err != nil {
			return nil, err
		}
	}
	cfg.Network = &p
	if err := l.WriteConfig(cfg); err != nil {
		return nil, err
	}
	if r.drivable() {
		if err := s.applyNetwork(ctx, l, cfg, r.rec, rules); err != nil {
			return nil, err
		}
	}
	return s.Status(id)
}

// checkLiveNetwork refuses, before anything is recorded, a policy that would give a running
// sandbox an interface its runtime cannot add while it runs: a microVM started without a
// NIC (its NetNS says so) keeps none until it is started again.
func (s *Supervisor) checkLiveNetwork(l *store.Lock, cfg *store.Config, rules *network.Rules) error {
	if err := checkLiveSecrets(l.ID(), cfg, rules); err != nil {
		return err
	}
	if !rules.Networked() || s.net.mgr == nil {
		return nil
	}
	if _, ok := s.net.get(l.ID()); ok {
		return nil
	}
	rt, err := s.runtimeFor(cfg)
	if err != nil {
		return err
	}
	gn, ok := rt.(runtime.GuestNetworker)
	if !ok {
		return nil
	}
	if pr, err := readPause(l.Dir()); err == nil && pr != nil && pr.Memory == MemoryReleased {
		// No QEMU runs to say whether it has a NIC, or to be given a network.
		return errcode.New(errcode.Unavailable, "Sandbox %s is paused with its memory released, so no guest is there to give a network; resume it, then set its network.", l.ID())
	}
	if _, err := gn.NetNS(l.Dir()); err != nil {
		return errcode.Wrap(errcode.Unavailable, err, "Sandbox %s runs under the %s runtime without a network interface, which cannot be added while it runs (%v); stop it, set its network, and start it again.", l.ID(), rt.Kind(), err)
	}
	return nil
}

// applyNetwork applies rules to a running sandbox: an update of the filter of one that has a
// network, a setup for one that has none.
func (s *Supervisor) applyNetwork(ctx context.Context, l *store.Lock, cfg *store.Config, rec *store.RuntimeRecord, rules *network.Rules) error {
	if _, ok := s.net.get(l.ID()); ok {
		if err := s.net.mgr.Update(l.ID(), rules); err != nil {
			return fmt.Errorf("replacing the network policy of %s: %w", l.ID(), err)
		}
		return nil
	}
	if !rules.Networked() {
		return nil
	}
	client, err := s.agent(ctx, l.Dir(), l.ID(), rec)
	if err != nil {
		return err
	}
	return s.attachNetwork(ctx, l, cfg, processOf(rec), client)
}

// networkStatus is what Status shows of a sandbox's network: its recorded policy, and its
// address while this process has it attached and it runs.
func (s *Supervisor) networkStatus(cfg *store.Config, state State) *NetworkStatus {
	if cfg.Network == nil {
		return nil
	}
	ns := &NetworkStatus{Policy: *cfg.Network}
	if att, ok := s.net.get(cfg.ID); ok && state == StateRunning {
		ns.Address = att.Address
	}
	return ns
}

// reconcileNetworks tears down the network of every sandbox that has a record but does not
// run, as start-up does after it reconciled each sandbox. A sandbox that this process attached
// runs. Each other is judged under its lifecycle lock, taken as a provision takes it so that
// it is held also for an id that has no sandbox (no start can then make a network for it
// meanwhile); a lock that another process holds past timeout is a transition of that process,
// which may be making this very network, so the record is left to it.
func (s *Supervisor) reconcileNetworks(ctx context.Context, timeout time.Duration) {
	if s.net.mgr == nil {
		return
	}
	ids, err := s.net.mgr.Recorded()
	if err != nil {
		s.log.Error("network: listing the network records", "err", err)
		return
	}
	for _, id := range ids {
		if _, ok := s.net.get(id); !ok {
			s.reconcileNetwork(ctx, id, timeout)
		}
	}
}

// reconcileNetwork tears down the recorded network of sandbox id unless, under its lock, it
// runs (under any runtime identity: one that another build runs keeps its network).
func (s *Supervisor) reconcileNetwork(ctx context.Context, id string, timeout time.Duration) {
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	l, err := s.store.LockForProvision(lctx, id)
	if err != nil {
		s.log.Warn("network: the sandbox of a network record is locked; its holder decides", "sandbox", id, "err", err)
		return
	}
	defer s.unlock(l)
	provisioned, err := l.Provisioned()
	if err != nil {
		s.log.Error("network: reconciling a network record", "sandbox", id, "err", err)
		return
	}
	if provisioned {
		r, err := s.reattach(lctx, l)
		if err != nil {
			s.log.Error("network: reconciling a network record", "sandbox", id, "err", err)
			return
		}
		if r.state == StateRunning {
			return
		}
	}
	s.log.Warn("network: tearing down the network of a sandbox that is not running", "sandbox", id, "provisioned", provisioned)
	s.detachNetwork(id)
}
