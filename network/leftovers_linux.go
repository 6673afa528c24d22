//go:build linux

package network

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/bothy/bothy/platform"
)

// Leftovers lists the network resources that have no live owner: records of sandboxes live
// does not report as live, and interfaces, nftables objects and gateway entries that no record
// names. It changes nothing. The caller says which sandboxes live (those whose runtime still
// runs them), since only it knows.
func (m *Manager) Leftovers(live func(id string) bool) (Leftovers, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leftovers(live)
}

func (m *Manager) leftovers(live func(id string) bool) (Leftovers, error) {
	var l Leftovers
	recs, others, err := readRecords(m.cfg.Dir)
	if err != nil {
		return l, err
	}
	ifs, gws, addrs := map[string]bool{}, map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for id, a := range recs {
		ifs[a.HostIf] = true
		if gw, addr, err := a.addrs(); err == nil {
			gws[gw], addrs[addr] = true, true
		}
		if !live(id) {
			l.Records = append(l.Records, id)
		}
	}
	for _, name := range others {
		if _, ok := platform.IsTempName(name); ok {
			l.Temp = append(l.Temp, name)
		}
	}

	h, err := m.netlink()
	if err != nil {
		return l, fmt.Errorf("network: open netlink: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return l, fmt.Errorf("network: list interfaces: %w", err)
	}
	for _, link := range links {
		if name := link.Attrs().Name; strings.HasPrefix(name, ifPrefix) && !ifs[name] {
			l.Interfaces = append(l.Interfaces, name)
		}
	}

	st, err := m.state()
	if err != nil {
		return l, err
	}
	orphan := func(id string, ok bool) bool { return ok && recs[id] == nil }
	for _, name := range st.chains {
		if orphan(idOf(name)) {
			l.Chains = append(l.Chains, name)
		}
	}
	for _, name := range st.sets {
		if orphan(idOf(name, setSuffixes...)) {
			l.Sets = append(l.Sets, name)
		}
	}
	for _, name := range st.counters {
		if orphan(idOf(name, counterSuffixes...)) {
			l.Counters = append(l.Counters, name)
		}
	}
	for _, g := range st.gateways {
		if !gws[g] {
			l.Gateways = append(l.Gateways, g)
		}
	}
	for _, a := range st.intercepted {
		if !addrs[a] {
			l.Intercepts = append(l.Intercepts, a)
		}
	}
	for _, list := range []*[]string{&l.Records, &l.Interfaces, &l.Chains, &l.Sets, &l.Counters, &l.Temp} {
		slices.Sort(*list)
	}
	return l, nil
}

// Repair removes the leftovers l lists (from [Manager.Leftovers]): a record's sandbox is torn
// down whole, and each orphan object is removed on its own. An object that is gone already is
// not an error; the first failure is reported after the rest have been tried.
func (m *Manager) Repair(l Leftovers) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, id := range l.Records {
		errs = append(errs, m.teardown(id))
	}
	for _, name := range l.Interfaces {
		if strings.HasPrefix(name, ifPrefix) {
			errs = append(errs, m.removeLink(name))
		}
	}
	chains := idsOf(l.Chains)
	sets := idsOf(l.Sets, setSuffixes...)
	counters := idsOf(l.Counters, counterSuffixes...)
	ids := func(id string) bool { return chains[id] || sets[id] || counters[id] }
	ifs := func(name string) bool { return slices.Contains(l.Interfaces, name) }
	gws := func(g netip.Addr) bool { return slices.Contains(l.Gateways, g) }
	errs = append(errs, m.removeFilter(ids, ifs, gws))
	for _, a := range l.Intercepts {
		errs = append(errs, m.clearIntercepts(a))
	}
	for _, name := range l.Temp {
		errs = append(errs, removeOther(m.cfg.Dir, name))
	}
	return errors.Join(errs...)
}

func idsOf(names []string, suffixes ...string) map[string]bool {
	ids := map[string]bool{}
	for _, n := range names {
		if id, ok := idOf(n, suffixes...); ok {
			ids[id] = true
		}
	}
	return ids
}

// linkNotFound reports whether err says an interface does not exist.
func linkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
