package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/supervisor"
)

// networkDir is the network Manager's record directory in the state root.
const networkDir = "network"

// logEvery bounds the network's log lines: per sandbox, at most one line of denied
// connections and one of refused names in each period, with the count since the last.
const logEvery = 10 * time.Second

// openNetwork makes the network Manager from the flags, or returns nil (sandboxes then get no
// network, and a policy that asks for one is refused) where it cannot work: not root, not
// Linux. It looks at the host's own firewall and logs, in one line, whether the sandboxes'
// traffic gets through it; where Docker's or ufw's rules would drop it, it adds accept rules
// for the sandboxes' interfaces there (docs/network.md). Nothing else on the host changes
// until the first networked sandbox starts.
func openNetwork(o *options, egress network.Egress, log *slog.Logger) (*netAccount, error) {
	if os.Geteuid() != 0 {
		log.Warn("sandboxes get no network: bothyd is not root, and making their interfaces and filters needs it")
		return nil, nil
	}
	cfg := network.Config{Upstream: o.dnsUpstream, Uplink: o.networkUplink, Log: log, Egress: egress}
	if o.networkPool != "" {
		p, err := netip.ParsePrefix(o.networkPool)
		if err != nil {
			return nil, fmt.Errorf("--network-pool %q: %v", o.networkPool, err)
		}
		cfg.Pool = p
	}
	dir, err := filepath.Abs(filepath.Join(o.root, networkDir))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("the network record directory: %w", err)
	}
	cfg.Dir = dir
	a := &netAccount{log: log, live: map[string]*drops{}}
	cfg.OnRefused = a.refused
	m, err := network.New(cfg)
	if errors.Is(err, platform.ErrUnsupported) {
		log.Warn("sandboxes get no network: this OS has no sandbox network")
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	a.Manager = m
	m.OpenHostFirewall()
	return a, nil
}

// hostFirewall is what /v1/info says of the host's firewall, nil when there is no network.
func (a *netAccount) hostFirewall() func() network.HostFirewall {
	if a == nil {
		return nil
	}
	return a.HostFirewall
}

// traffic reads a sandbox's network bytes for the usage sampler, nil when there is no network.
func (a *netAccount) traffic() func(id string) (network.Traffic, error) {
	if a == nil {
		return nil
	}
	return a.Traffic
}

// netAccount is the Manager with the accounting /metrics and the log need: the drop counters
// of a sandbox vanish with its filter, so they are added up at its teardown.
type netAccount struct {
	*network.Manager
	log *slog.Logger

	mu      sync.Mutex
	live    map[string]*drops // by sandbox id: those set up
	retired network.Drops     // of the sandboxes torn down
}

// drops is what was logged of one sandbox's denials.
type drops struct {
	logged          network.Drops
	refused, quiet  uint64 // refused names, and those not logged yet
	lastRefusedLine time.Time
}

// Setup implements supervisor.Networker.
func (a *netAccount) Setup(id string, t network.Target, r *network.Rules) (network.Attachment, error) {
	att, err := a.Manager.Setup(id, t, r)
	a.mu.Lock()
	if a.live[id] == nil {
		a.live[id] = &drops{}
	}
	a.mu.Unlock()
	return att, err
}

// Teardown implements supervisor.Networker, keeping the sandbox's counts.
func (a *netAccount) Teardown(id string) error {
	a.mu.Lock()
	_, ok := a.live[id]
	a.mu.Unlock()
	if ok {
		if d, err := a.Drops(id); err == nil {
			a.mu.Lock()
			a.retired.AlwaysDenied += d.AlwaysDenied
			a.retired.Policy += d.Policy
			a.mu.Unlock()
		}
	}
	err := a.Manager.Teardown(id)
	if err == nil {
		a.mu.Lock()
		delete(a.live, id)
		a.mu.Unlock()
	}
	return err
}

// denied is bothy_network_denied_total's counts.
func (a *netAccount) denied() map[string]uint64 {
	a.mu.Lock()
	ids := make([]string, 0, len(a.live))
	for id := range a.live {
		ids = append(ids, id)
	}
	total := a.retired
	a.mu.Unlock()
	for _, id := range ids {
		if d, err := a.Drops(id); err == nil {
			total.AlwaysDenied += d.AlwaysDenied
			total.Policy += d.Policy
		}
	}
	host, _ := a.HostDrops()
	return map[string]uint64{"always-denied": total.AlwaysDenied, "policy": total.Policy, "host": host, "dns-refused": a.Refused()}
}

// refused logs a refused name, at most one line per sandbox per logEvery; it must not block,
// and takes only a short lock.
func (a *netAccount) refused(id, name string) {
	a.mu.Lock()
	d := a.live[id]
	if d == nil {
		// A sandbox whose setup has not returned yet, or is torn down: logged unbounded, as
		// that window is short.
		a.mu.Unlock()
		a.log.Warn("network: name refused by the sandbox's policy", "sandbox", id, "name", name)
		return
	}
	d.refused++
	d.quiet++
	if time.Since(d.lastRefusedLine) < logEvery {
		a.mu.Unlock()
		return
	}
	n := d.quiet
	d.quiet, d.lastRefusedLine = 0, time.Now()
	a.mu.Unlock()
	a.log.Warn("network: name refused by the sandbox's policy", "sandbox", id, "name", name, "refused", n)
}

// watch logs, every logEvery until ctx ends, the connections each sandbox had denied since
// the last line.
func (a *netAccount) watch(ctx context.Context) {
	t := time.NewTicker(logEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		ids := make([]string, 0, len(a.live))
		for id := range a.live {
			ids = append(ids, id)
		}
		a.mu.Unlock()
		for _, id := range ids {
			d, err := a.Drops(id)
			if err != nil {
				continue
			}
			a.mu.Lock()
			st := a.live[id]
			var prev network.Drops
			if st != nil {
				prev, st.logged = st.logged, d
			}
			a.mu.Unlock()
			if st != nil && (d.AlwaysDenied > prev.AlwaysDenied || d.Policy > prev.Policy) {
				a.log.Warn("network: connections denied", "sandbox", id,
					"always_denied", d.AlwaysDenied-prev.AlwaysDenied, "policy", d.Policy-prev.Policy)
			}
		}
	}
}

// networker is the supervisor's view of a, nil when there is none (not a typed nil).
func (a *netAccount) networker() supervisor.Networker {
	if a == nil {
		return nil
	}
	return a
}

// checkerNetwork is the network Manager for `bothyd check`, nil when the state root has no
// network records directory (no sandbox ever had a network) or this is not root. It sets
// nothing up: the checker only lists and removes leftovers, and the upstream is never asked.
func checkerNetwork(root string, log *slog.Logger) (*network.Manager, error) {
	dir, err := filepath.Abs(filepath.Join(root, networkDir))
	if err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || os.Geteuid() != 0 {
		return nil, nil
	}
	m, err := network.New(network.Config{Dir: dir, Upstream: "127.0.0.1:53", Log: log})
	if errors.Is(err, platform.ErrUnsupported) {
		return nil, nil
	}
	return m, err
}
