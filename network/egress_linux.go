//go:build linux

package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The egress proxy's part of a sandbox's network (docs/secrets.md): for a sandbox whose policy
// binds a secret, a listener on port EgressPort of its gateway handed to [Config].Egress, and
// entries in the intercept set for each address its resolver answers for a bound host name,
// which the prerouting chain redirects (port 443) to that listener. A sandbox without a
// binding has neither, and its traffic never meets the proxy.

// interceptTTL bounds an intercept entry's life as a pin's is bounded.
func interceptTTL(ttl uint32) time.Duration { return pinTTL(ttl) }

// addrAllowed reports whether the sandbox's filter lets it reach addr on port 443, for an
// address its resolver answered for a name the rules allow: the proxy must dial nothing the
// filter would drop (never-reachable ranges, the pools, deny entries, private ranges not
// opened by name, and the host itself).
func (m *Manager) addrAllowed(rules *Rules, addr netip.Addr, pools []netip.Prefix) bool {
	if !addr.Is4() {
		return false
	}
	one := netip.PrefixFrom(addr, 32)
	if within(one, m.never) || within(one, pools) {
		return false
	}
	for _, e := range rules.Deny {
		if (e.Kind == Prefix && e.Prefix.Contains(addr)) || (e.Kind == AddrPort && e.Prefix.Addr() == addr && e.Port == 443) {
			return false
		}
	}
	if within(one, privateRanges) {
		opened := false
		for _, e := range rules.Allow {
			if e.Private() && e.Prefix.Contains(addr) && (e.Kind == Prefix || e.Port == 443) {
				opened = true
			}
		}
		if !opened {
			return false
		}
	}
	return !m.isLocal(addr)
}

// isLocal reports whether addr is an address of the host (its route is local): the proxy,
// which dials from the host, would reach the host's own services there.
func (m *Manager) isLocal(addr netip.Addr) bool {
	h, err := m.netlink()
	if err != nil {
		return true
	}
	defer h.Close()
	routes, err := h.RouteGet(addr.AsSlice())
	if err != nil || len(routes) == 0 {
		return true
	}
	return routes[0].Type == unix.RTN_LOCAL
}

// interceptAnswers adds the IPv4 addresses of resp, answered for a bound name, to the intercept
// set (sandbox address . destination) for their TTL, and to sb's memory of them, which the
// proxy asks before it dials. An address the filter would not let the sandbox reach is left
// out: the sandbox's connection to it is dropped by its filter as it would be without a secret.
func (m *Manager) interceptAnswers(sb *sandbox, rules *Rules, resp *dns.Msg) error {
	pools, err := m.pools()
	if err != nil {
		return err
	}
	type fresh struct {
		addr  netip.Addr
		until time.Time
	}
	var add []fresh
	for _, rr := range resp.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		addr, ok := netip.AddrFromSlice(a.A.To4())
		if !ok || !m.addrAllowed(rules, addr, pools) {
			continue
		}
		add = append(add, fresh{addr, time.Now().Add(interceptTTL(a.Hdr.Ttl))})
	}
	if len(add) == 0 {
		return nil
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.rules != rules {
		return fmt.Errorf("the policy changed while the name was resolved")
	}
	if len(sb.intercepts)+len(add) > m.lim.pinsPerSandbox {
		now := time.Now()
		for a, until := range sb.intercepts {
			if !until.After(now) {
				delete(sb.intercepts, a)
			}
		}
		if len(sb.intercepts)+len(add) > m.lim.pinsPerSandbox {
			return fmt.Errorf("%d addresses would be intercepted, and the bound is %d", len(sb.intercepts)+len(add), m.lim.pinsPerSandbox)
		}
	}
	c, err := m.nft()
	if err != nil {
		return err
	}
	set := interceptSetOf()
	var del, elems []nftables.SetElement
	for _, f := range add {
		key := interceptKey(sb.att.Address, f.addr)
		if old, ok := sb.intercepts[f.addr]; ok {
			if old.After(f.until) {
				continue
			}
			del = append(del, nftables.SetElement{Key: key})
		}
		elems = append(elems, nftables.SetElement{Key: key, Timeout: time.Until(f.until).Round(time.Second)})
	}
	if len(elems) == 0 {
		return nil
	}
	if len(del) > 0 {
		if err := c.SetDeleteElements(set, del); err != nil {
			return err
		}
	}
	if err := c.SetAddElements(set, elems); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("add to the intercept set: %w", err)
	}
	for _, f := range add {
		if old, ok := sb.intercepts[f.addr]; !ok || old.Before(f.until) {
			sb.intercepts[f.addr] = f.until
		}
	}
	return nil
}

// intercepted reports whether the proxy may dial dst for sb: port 443 of an address its
// resolver answered for a bound name, still within its TTL.
func (sb *sandbox) intercepted(dst netip.AddrPort) bool {
	if dst.Port() != 443 {
		return false
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	until, ok := sb.intercepts[dst.Addr()]
	return ok && time.Now().Before(until)
}

// clearIntercepts removes the intercept set's entries of a sandbox address: at a teardown,
// at a setup (an address of the pool may have been another sandbox's) and at a policy change.
func (m *Manager) clearIntercepts(addr netip.Addr) error {
	_, err := m.pruneIntercepts(addr, func(netip.Addr) bool { return false })
	return err
}

// pruneIntercepts removes the intercept set's entries of a sandbox address whose destination
// keep refuses, and returns those it kept, until when (the kernel's remaining timeout): the
// entries outlive bothyd, and an adoption keeps those its policy still allows.
func (m *Manager) pruneIntercepts(addr netip.Addr, keep func(dst netip.Addr) bool) (map[netip.Addr]time.Time, error) {
	kept := map[netip.Addr]time.Time{}
	if !addr.IsValid() {
		return kept, nil
	}
	c, err := m.nft()
	if err != nil {
		return nil, err
	}
	set := interceptSetOf()
	elems, err := c.GetSetElements(set)
	if err != nil {
		return kept, nil // no set yet: nothing to clear
	}
	a := addr.As4()
	now := time.Now()
	var del []nftables.SetElement
	for _, e := range elems {
		if len(e.Key) < 8 || [4]byte(e.Key[:4]) != a {
			continue
		}
		dst := netip.AddrFrom4([4]byte(e.Key[4:8]))
		// An entry within a second of its end is let go rather than kept for a moment.
		if e.Expires > time.Second && len(kept) < m.lim.pinsPerSandbox && keep(dst) {
			kept[dst] = now.Add(e.Expires)
			continue
		}
		del = append(del, nftables.SetElement{Key: e.Key})
	}
	if len(del) == 0 {
		return kept, nil
	}
	if err := c.SetDeleteElements(set, del); err != nil {
		return nil, err
	}
	return kept, c.Flush()
}

// interceptKeeper says which of the intercept entries an earlier bothyd left for a sandbox an
// adoption keeps, given the pins it keeps: those the resolver would add under the policy of
// now. The destination must be one the sandbox's filter lets it reach (as interceptAnswers
// asks), and, when the policy pins answers, one pinned for a name a secret is bound to: a
// redirected connection never meets the filter (it goes to the proxy on the gateway), so the
// proxy must dial only what the filter would let through, and an entry whose pin is gone (its
// name no longer allowed) would let it dial past the filter. The entries were put there by a
// resolver of bothyd (no one else writes bothyd's table but root on the host), so keeping them
// is keeping what the sandbox resolved; dropping them would send the sandbox's connections to
// those addresses straight out, with the placeholder, until it resolved the name again.
func (m *Manager) interceptKeeper(rules *Rules, pins []pin) func(netip.Addr) bool {
	pools, err := m.pools()
	if err != nil {
		return func(netip.Addr) bool { return false }
	}
	bound := map[netip.Addr]bool{}
	for _, p := range pins {
		if rules.bindsName(p.name) {
			bound[p.addr] = true
		}
	}
	return func(dst netip.Addr) bool {
		if rules.pins() && !bound[dst] {
			return false
		}
		return m.addrAllowed(rules, dst, pools)
	}
}

// startEgress opens sb's proxy listener on its gateway, bound to its interface as its
// resolver's sockets are, and hands it to the proxy; for a policy without secrets it stops
// one that runs.
func (m *Manager) startEgress(sb *sandbox, rules *Rules) error {
	if m.cfg.Egress == nil {
		if len(rules.Secrets) > 0 {
			return fmt.Errorf("network: the policy of %s binds secrets, and this server has no egress proxy", sb.id)
		}
		return nil
	}
	if len(rules.Secrets) == 0 {
		if sb.egress {
			m.cfg.Egress.Stop(sb.id)
			sb.egress = false
		}
		return nil
	}
	if sb.egress {
		m.cfg.Egress.Update(sb.id, rules.Secrets)
		return nil
	}
	at := netip.AddrPortFrom(sb.att.Gateway, EgressPort).String()
	var ln net.Listener
	err := m.inHost(func() (err error) {
		lc := net.ListenConfig{Control: bindToDevice(sb.att.Interface)}
		ln, err = lc.Listen(context.Background(), "tcp4", at)
		return err
	})
	if err != nil {
		return fmt.Errorf("network: start the egress proxy of %s on %s: %w", sb.id, at, err)
	}
	if err := m.cfg.Egress.Serve(sb.id, ln, rules.Secrets, sb.intercepted); err != nil {
		ln.Close()
		return err
	}
	sb.egress = true
	return nil
}
