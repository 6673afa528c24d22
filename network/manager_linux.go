//go:build linux

package network

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/internal/ratelog"
	"github.com/bothy/bothy/naming"
)

// Manager makes, updates and removes the network of sandboxes on one host. One Manager runs
// per host (the caller holds bothyd's single-instance lock); its methods are safe for
// concurrent use.
type Manager struct {
	cfg   Config
	nsFD  int // HostNS's descriptor, or -1 for the process's own namespace
	never []netip.Prefix
	log   *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	baseDone  bool

	refused atomic.Uint64

	// lim are the resolvers' bounds; conns and pending count against them for all sandboxes
	// together, each sandbox's own gates for it alone (bounds.go). rl logs what sandboxes
	// can cause, at a bounded rate.
	lim            limits
	conns, pending gate
	rl             *ratelog.Keyed
	// fwMu orders the looks at the host's firewall; fw is the last one's finding.
	fwMu sync.Mutex
	fw   HostFirewall
}

// sandbox is a set-up sandbox's live state: its policy, its resolver and what it pinned.
type sandbox struct {
	id    string
	alloc *allocation
	att   Attachment

	mu    sync.Mutex
	rules *Rules
	pins  map[netip.Addr]pin
	// intercepts are the addresses answered for names a secret is bound to, until when;
	// egress says whether the proxy serves the sandbox (egress_linux.go).
	intercepts map[netip.Addr]time.Time
	egress     bool

	servers []*dns.Server
	// stopped says the resolver was stopped on purpose, so its servers' ends are not warned of.
	stopped atomic.Bool
	refused atomic.Uint64
	// conns and pending are the sandbox's own share of the resolver's bounds.
	conns, pending gate
}

// New returns a Manager and makes sure bothyd's nftables table and base chains exist. It
// does not touch sandboxes set up by an earlier process: call [Manager.Setup] again for those
// that still run (it is idempotent) and [Manager.Repair] for the rest.
func New(cfg Config) (*Manager, error) {
	if cfg.Dir == "" || !naming.IsCleanAbs(cfg.Dir) {
		return nil, fmt.Errorf("network: the record directory %q is not a clean absolute path", cfg.Dir)
	}
	if !cfg.Pool.IsValid() {
		cfg.Pool = DefaultPool
	}
	if err := CheckPool(cfg.Pool); err != nil {
		return nil, err
	}
	if cfg.Upstream == "" {
		conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil || len(conf.Servers) == 0 {
			return nil, fmt.Errorf("network: no --dns-upstream given and no nameserver in /etc/resolv.conf: %v", err)
		}
		a, err := netip.ParseAddr(conf.Servers[0])
		if err != nil {
			return nil, fmt.Errorf("network: the nameserver %q of /etc/resolv.conf is not an address: %w", conf.Servers[0], err)
		}
		cfg.Upstream = netip.AddrPortFrom(a, 53).String()
	}
	m := &Manager{cfg: cfg, nsFD: -1, sandboxes: map[string]*sandbox{}, log: cfg.Log}
	if m.log == nil {
		m.log = slog.Default()
	}
	if cfg.HostNS != nil {
		m.nsFD = int(cfg.HostNS.Fd())
	}
	m.never = append(m.never, alwaysDenied...)
	m.setLimits(defaultLimits)
	m.rl = ratelog.NewKeyed(m.log, logEvery, maxLogKeys)
	return m, nil
}

// inHost runs fn on a thread in the Manager's namespace; a socket fn opens stays there. When
// the thread cannot be returned to its namespace it is left locked, so that Go retires it
// rather than let another goroutine run in the wrong namespace.
func (m *Manager) inHost(fn func() error) error {
	if m.nsFD < 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(netns.NsHandle(m.nsFD)); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("network: enter the host namespace: %w", err)
			return
		}
		err = fn()
		if rerr := netns.Set(orig); rerr != nil {
			errc <- errors.Join(err, fmt.Errorf("network: return from the host namespace: %w", rerr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

func (m *Manager) nft() (*nftables.Conn, error) {
	if m.nsFD >= 0 {
		return nftables.New(nftables.WithNetNSFd(m.nsFD))
	}
	return nftables.New()
}

func (m *Manager) netlink() (*netlink.Handle, error) {
	if m.nsFD >= 0 {
		return netlink.NewHandleAt(netns.NsHandle(m.nsFD))
	}
	return netlink.NewHandle()
}

// pools returns the manager's pool and every other pool a record names, so that sandboxes of
// an earlier pool stay apart from the rest too.
func (m *Manager) pools() ([]netip.Prefix, error) {
	recs, _, err := readRecords(m.cfg.Dir)
	if err != nil {
		return nil, err
	}
	pools := []netip.Prefix{m.cfg.Pool}
	for _, a := range recs {
		if p, err := netip.ParsePrefix(a.Pool); err == nil && p.Addr().Is4() && p != m.cfg.Pool && !contains(pools, p) {
			pools = append(pools, p)
		}
	}
	return pools, nil
}

func contains(ps []netip.Prefix, p netip.Prefix) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// ensureBase makes the table and base chains once per Manager, and turns IPv4 forwarding on
// in the host namespace, which routing sandbox traffic needs.
func (m *Manager) ensureBase() error {
	if m.baseDone {
		return nil
	}
	pools, err := m.pools()
	if err != nil {
		return err
	}
	c, err := m.nft()
	if err != nil {
		return fmt.Errorf("network: open nftables: %w", err)
	}
	if err := addBase(c, m.never, pools, m.cfg.Uplink); err != nil {
		return fmt.Errorf("network: prepare the base table: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: make the base table: %w", err)
	}
	err = m.inHost(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0) })
	if err != nil {
		return fmt.Errorf("network: turn on IPv4 forwarding: %w", err)
	}
	m.baseDone = true
	return nil
}

// Setup gives sandbox id a network under rules: it records the allocation, then makes the
// sandbox's chain, sets and counters and its entry in the dispatch map, then the veth pair
// (the sandbox's end created directly in target as eth0) with addresses and routes, and last
// the resolver on the gateway. Every step is idempotent, so Setup after a crash, or twice,
// completes what is missing. On failure the caller calls [Manager.Teardown].
func (m *Manager) Setup(id string, target Target, rules *Rules) (Attachment, error) {
	if err := naming.CheckID(id); err != nil {
		return Attachment{}, fmt.Errorf("network: %w", err)
	}
	if !rules.Networked() {
		return Attachment{}, fmt.Errorf("network: the policy of %s allows nothing, so it gets no interface", id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.ensureBase(); err != nil {
		return Attachment{}, err
	}
	a, err := allocate(m.cfg.Dir, id, m.cfg.Pool)
	if err != nil {
		return Attachment{}, err
	}
	sub, err := a.subnet()
	if err != nil {
		return Attachment{}, err
	}
	gw, addr, _ := a.addrs()
	att := Attachment{Interface: a.HostIf, Subnet: sub, Gateway: gw, Address: addr}
	sb := m.sandboxes[id]
	if sb == nil {
		sb = &sandbox{id: id, alloc: a, att: att}
		sb.conns.max, sb.pending.max = m.lim.connsPerSandbox, m.lim.pendingPerSandbox
	}
	if err := m.filter(sb, rules, target.Adopt); err != nil {
		return att, err
	}
	// A firewall started or reloaded since bothyd's start (Docker's, ufw's) may have come
	// between: its rules are looked at again, before the interface exists. What it finds is
	// reported, not a failure: the sandbox's own filter is in place either way.
	m.OpenHostFirewall()
	if err := m.plumb(a, att, target); err != nil {
		return att, err
	}
	if sb.servers == nil {
		if err := m.serve(sb); err != nil {
			return att, err
		}
	}
	if err := m.startEgress(sb, rules); err != nil {
		return att, err
	}
	m.sandboxes[id] = sb
	m.log.Info("network: sandbox attached", "sandbox", id, "interface", a.HostIf, "address", addr)
	return att, nil
}

// filter makes sb's chain, sets and counters for rules, its dispatch entry and its gateway's
// entry, in one transaction. A first set-up forgets what sb had pinned and intercepted (the
// transaction empties the pinned set); an adoption keeps what of it the policy still allows
// (inherited), so that a sandbox's connections to an address it resolved before a restart of
// bothyd are still let through, and still meet the egress proxy.
func (m *Manager) filter(sb *sandbox, rules *Rules, adopt bool) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	id, a, gw := sb.id, sb.alloc, sb.att.Gateway
	var pins []pin
	if adopt {
		pins = m.inheritedPins(id, rules)
	}
	c, err := m.nft()
	if err != nil {
		return fmt.Errorf("network: open nftables: %w", err)
	}
	if err := addPolicy(c, id, rules, pins); err != nil {
		return err
	}
	dispatch := &nftables.Set{Table: table, Name: dispatchMap, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	if err := c.SetAddElements(dispatch, []nftables.SetElement{{Key: ifname(a.HostIf),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chainOf(id)}}}); err != nil {
		return err
	}
	gwb := gw.As4()
	if err := c.SetAddElements(ipv4Set(gatewaysSet, false, false), []nftables.SetElement{{Key: gwb[:]}}); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: make the filter of %s: %w", id, err)
	}
	keep := func(netip.Addr) bool { return false }
	if adopt && len(rules.Secrets) > 0 {
		keep = m.interceptKeeper(rules, pins)
	}
	intercepts, err := m.pruneIntercepts(sb.att.Address, keep)
	if err != nil {
		return fmt.Errorf("network: clear the intercepted addresses of %s: %w", id, err)
	}
	sb.rules, sb.pins, sb.intercepts = rules, map[netip.Addr]pin{}, intercepts
	for _, p := range pins {
		sb.pins[p.addr] = p
	}
	return nil
}

// openTarget returns a handle on the sandbox's network namespace, which the caller closes.
func openTarget(t Target) (netns.NsHandle, error) {
	switch {
	case t.NS != nil:
		fd, err := unix.Dup(int(t.NS.Fd()))
		if err != nil {
			return netns.None(), fmt.Errorf("network: duplicate the namespace descriptor: %w", err)
		}
		return netns.NsHandle(fd), nil
	case t.PID > 0:
		h, err := netns.GetFromPid(t.PID)
		if err != nil {
			return netns.None(), fmt.Errorf("network: open the network namespace of pid %d: %w", t.PID, err)
		}
		return h, nil
	}
	return netns.None(), errors.New("network: the target names neither a pid nor a namespace")
}

// plumb makes the veth pair and configures both ends; a pair that is already there is kept.
func (m *Manager) plumb(a *allocation, att Attachment, target Target) error {
	host, err := m.netlink()
	if err != nil {
		return fmt.Errorf("network: open netlink: %w", err)
	}
	defer host.Close()
	ns, err := openTarget(target)
	if err != nil {
		return err
	}
	defer ns.Close()
	inside, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("network: open netlink in the sandbox: %w", err)
	}
	defer inside.Close()

	if l, err := host.LinkByName(a.HostIf); err == nil {
		// A pair from an earlier Setup is kept when its other end is in this sandbox;
		// otherwise it belongs to a namespace that is gone or another, and is made anew.
		if _, err := inside.LinkByName("eth0"); err != nil {
			if err := host.LinkDel(l); err != nil {
				return fmt.Errorf("network: remove the stale interface %s: %w", a.HostIf, err)
			}
		}
	}
	if _, err := host.LinkByName(a.HostIf); err != nil {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.HostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
		if err := host.LinkAdd(veth); err != nil {
			return fmt.Errorf("network: make the veth pair %s: %w", a.HostIf, err)
		}
	}
	hl, err := host.LinkByName(a.HostIf)
	if err != nil {
		return fmt.Errorf("network: find %s: %w", a.HostIf, err)
	}
	if err := host.AddrReplace(hl, &netlink.Addr{IPNet: ipnet(att.Gateway, att.Subnet.Bits())}); err != nil {
		return fmt.Errorf("network: address %s: %w", a.HostIf, err)
	}
	if err := m.strictSources(a.HostIf); err != nil {
		return err
	}
	if err := host.LinkSetUp(hl); err != nil {
		return fmt.Errorf("network: bring %s up: %w", a.HostIf, err)
	}

	if lo, err := inside.LinkByName("lo"); err == nil {
		if err := inside.LinkSetUp(lo); err != nil {
			return fmt.Errorf("network: bring the sandbox's lo up: %w", err)
		}
	}
	el, err := inside.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("network: find the sandbox's eth0: %w", err)
	}
	if err := inside.AddrReplace(el, &netlink.Addr{IPNet: ipnet(att.Address, att.Subnet.Bits())}); err != nil {
		return fmt.Errorf("network: address the sandbox's eth0: %w", err)
	}
	if err := inside.LinkSetUp(el); err != nil {
		return fmt.Errorf("network: bring the sandbox's eth0 up: %w", err)
	}
	route := &netlink.Route{LinkIndex: el.Attrs().Index, Gw: att.Gateway.AsSlice()}
	if err := inside.RouteReplace(route); err != nil {
		return fmt.Errorf("network: route the sandbox through %s: %w", att.Gateway, err)
	}
	return nil
}

// strictSources turns strict reverse-path filtering on for a sandbox's host end, before it is
// up: root in a sandbox may give its eth0 any address, and a packet whose source is not in the
// sandbox's own subnet (another sandbox's address, which the pool's masquerade would carry out
// as the host's, or any outside one) is then dropped by the routing decision, before any
// nftables rule, the established-connections one included, can take it for a reply or send it
// on. The kernel uses the larger of this and conf/all's value, so a host's own setting can
// only make it stricter.
func (m *Manager) strictSources(ifname string) error {
	err := m.inHost(func() error {
		return os.WriteFile(filepath.Join("/proc/sys/net/ipv4/conf", ifname, "rp_filter"), []byte("1\n"), 0)
	})
	if err != nil {
		return fmt.Errorf("network: turn on reverse-path filtering for %s: %w", ifname, err)
	}
	return nil
}

// Update replaces the policy of a set-up sandbox, in one nftables transaction: its chain and
// sets are flushed and refilled, and the answers it had pinned for names the new policy still
// allows are pinned again for what is left of their TTL. New connections follow the new policy
// at once; established ones continue.
func (m *Manager) Update(id string, rules *Rules) error {
	if rules == nil {
		rules = &Rules{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sb := m.sandboxes[id]
	if sb == nil {
		return fmt.Errorf("network: %s has no network set up by this process", id)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	keep := map[netip.Addr]pin{}
	var pins []pin
	if rules.pins() {
		for addr, p := range sb.pins {
			if p.live() && rules.AllowsName(p.name) {
				keep[addr] = p
				pins = append(pins, p)
			}
		}
	}
	c, err := m.nft()
	if err != nil {
		return fmt.Errorf("network: open nftables: %w", err)
	}
	if err := addPolicy(c, id, rules, pins); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: replace the policy of %s: %w", id, err)
	}
	// What was intercepted for the old bindings goes; the new ones fill it at their names'
	// next resolution.
	if err := m.clearIntercepts(sb.att.Address); err != nil {
		return fmt.Errorf("network: clear the intercepted addresses of %s: %w", id, err)
	}
	sb.rules, sb.pins, sb.intercepts = rules, keep, map[netip.Addr]time.Time{}
	return m.startEgress(sb, rules)
}

// Teardown removes everything Setup made for id, in the reverse order (resolver, filter,
// interface), and last its record. It is idempotent, and works from the record alone, so that
// it removes what a crashed process made.
func (m *Manager) Teardown(id string) error {
	if err := naming.CheckID(id); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.teardown(id)
}

// Recorded lists, sorted, the sandboxes that have an allocation record: those whose network
// was set up and not yet torn down whole, by this process or any earlier one. Whether each
// still runs is the caller's to judge, under the sandbox's lifecycle lock, before it calls
// [Manager.Teardown] for one that does not. What an interrupted record write left, a
// temporary file that a crash kept from its rename, goes: its allocation was never made, and
// this process's own writes wait for the manager's lock, which Recorded holds.
func (m *Manager) Recorded() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	recs, others, err := readRecords(m.cfg.Dir)
	if err != nil {
		return nil, err
	}
	for _, name := range others {
		if err := removeOther(m.cfg.Dir, name); err != nil {
			return nil, fmt.Errorf("network: remove an interrupted record write: %w", err)
		}
	}
	ids := make([]string, 0, len(recs))
	for id := range recs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

func (m *Manager) teardown(id string) error {
	if sb := m.sandboxes[id]; sb != nil {
		sb.stopResolver()
		if sb.egress && m.cfg.Egress != nil {
			m.cfg.Egress.Stop(id)
		}
		delete(m.sandboxes, id)
	}
	recs, _, err := readRecords(m.cfg.Dir)
	if err != nil {
		return err
	}
	a := recs[id]
	var ifName string
	var gw netip.Addr
	if a != nil {
		ifName = a.HostIf
		var sbAddr netip.Addr
		gw, sbAddr, _ = a.addrs()
		if err := m.clearIntercepts(sbAddr); err != nil {
			return fmt.Errorf("network: clear the intercepted addresses of %s: %w", id, err)
		}
	}
	if err := m.removeFilter(func(sid string) bool { return sid == id }, func(n string) bool { return n == ifName },
		func(g netip.Addr) bool { return g == gw }); err != nil {
		return err
	}
	if ifName != "" {
		if err := m.removeLink(ifName); err != nil {
			return err
		}
	}
	if a != nil {
		if err := forget(m.cfg.Dir, id); err != nil {
			return err
		}
		m.log.Info("network: sandbox detached", "sandbox", id, "interface", ifName)
	}
	return nil
}

func (m *Manager) removeLink(name string) error {
	h, err := m.netlink()
	if err != nil {
		return fmt.Errorf("network: open netlink: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		if linkNotFound(err) {
			return nil
		}
		return fmt.Errorf("network: find %s: %w", name, err)
	}
	// Removing one end of a veth pair removes the other, wherever it is.
	if err := h.LinkDel(l); err != nil {
		return fmt.Errorf("network: remove %s: %w", name, err)
	}
	return nil
}

// removeFilter deletes, in one transaction, the per-sandbox chains, sets and counters whose
// sandbox id matches, the dispatch entries of matching interfaces or jumping to a matching
// chain, and the matching gateway addresses; it deletes only what exists, so that the
// transaction, which fails whole on one missing object, goes through.
func (m *Manager) removeFilter(ids func(string) bool, ifs func(string) bool, gws func(netip.Addr) bool) error {
	st, err := m.state()
	if err != nil || !st.table {
		return err
	}
	c, err := m.nft()
	if err != nil {
		return fmt.Errorf("network: open nftables: %w", err)
	}
	dispatch := &nftables.Set{Table: table, Name: dispatchMap, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	var elems []nftables.SetElement
	for _, e := range st.dispatch {
		if ifs(e.ifName) || ids(e.id) {
			elems = append(elems, nftables.SetElement{Key: ifname(e.ifName)})
		}
	}
	if len(elems) > 0 {
		if err := c.SetDeleteElements(dispatch, elems); err != nil {
			return err
		}
	}
	var gwElems []nftables.SetElement
	for _, g := range st.gateways {
		if gws(g) {
			b := g.As4()
			gwElems = append(gwElems, nftables.SetElement{Key: b[:]})
		}
	}
	if len(gwElems) > 0 {
		if err := c.SetDeleteElements(ipv4Set(gatewaysSet, false, false), gwElems); err != nil {
			return err
		}
	}
	// Rules go with their chain, before the sets and counters they name.
	for _, name := range st.chains {
		if id, _ := idOf(name); ids(id) {
			ch := &nftables.Chain{Name: name, Table: table}
			c.FlushChain(ch)
			c.DelChain(ch)
		}
	}
	for _, name := range st.sets {
		if id, _ := idOf(name, setSuffixes...); ids(id) {
			c.DelSet(&nftables.Set{Table: table, Name: name})
		}
	}
	for _, name := range st.counters {
		if id, _ := idOf(name, counterSuffixes...); ids(id) {
			c.DeleteObject(&nftables.NamedObj{Table: table, Name: name, Type: nftables.ObjTypeCounter})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: remove filters: %w", err)
	}
	return nil
}

// dispatchEntry is one entry of the dispatch map: a host interface and the sandbox whose chain
// it jumps to.
type dispatchEntry struct{ ifName, id string }

// nftState is what bothyd's table holds per sandbox.
type nftState struct {
	table    bool
	chains   []string // per-sandbox chains
	sets     []string // per-sandbox sets
	counters []string // per-sandbox counters
	dispatch []dispatchEntry
	gateways []netip.Addr
	// intercepted are the sandbox addresses with entries in the intercept set.
	intercepted []netip.Addr
}

// state lists the per-sandbox objects of bothyd's table; a table that is not there holds
// none.
func (m *Manager) state() (nftState, error) {
	var st nftState
	c, err := m.nft()
	if err != nil {
		return st, fmt.Errorf("network: open nftables: %w", err)
	}
	if _, err := c.ListTableOfFamily(tableName, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return st, nil
		}
		return st, fmt.Errorf("network: list the table: %w", err)
	}
	st.table = true
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return st, fmt.Errorf("network: list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == tableName {
			if _, ok := idOf(ch.Name); ok {
				st.chains = append(st.chains, ch.Name)
			}
		}
	}
	sets, err := c.GetSets(table)
	if err != nil {
		return st, fmt.Errorf("network: list sets: %w", err)
	}
	for _, s := range sets {
		if err := st.takeSet(c, s); err != nil {
			return st, err
		}
	}
	objs, err := c.GetNamedObjects(table)
	if err != nil {
		return st, fmt.Errorf("network: list counters: %w", err)
	}
	for _, o := range objs {
		if n, ok := o.(*nftables.NamedObj); ok && n.Type == nftables.ObjTypeCounter {
			if _, ok := idOf(n.Name, counterSuffixes...); ok {
				st.counters = append(st.counters, n.Name)
			}
		}
	}
	return st, nil
}

// takeSet adds what bothyd's set s holds to st: the dispatch map's and the gateways' and the
// intercept set's entries, or a per-sandbox set's name.
func (st *nftState) takeSet(c *nftables.Conn, s *nftables.Set) error {
	switch s.Name {
	case dispatchMap:
		elems, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("network: list the dispatch map: %w", err)
		}
		for _, e := range elems {
			d := dispatchEntry{ifName: cstring(e.Key)}
			if e.VerdictData != nil {
				d.id, _ = idOf(e.VerdictData.Chain)
			}
			st.dispatch = append(st.dispatch, d)
		}
	case gatewaysSet:
		elems, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("network: list the gateways: %w", err)
		}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				st.gateways = append(st.gateways, a)
			}
		}
	case interceptSet:
		elems, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("network: list the intercept set: %w", err)
		}
		seen := map[netip.Addr]bool{}
		for _, e := range elems {
			if len(e.Key) < 4 {
				continue
			}
			if a := netip.AddrFrom4([4]byte(e.Key[:4])); !seen[a] {
				seen[a] = true
				st.intercepted = append(st.intercepted, a)
			}
		}
	default:
		if _, ok := idOf(s.Name, setSuffixes...); ok {
			st.sets = append(st.sets, s.Name)
		}
	}
	return nil
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

// Drops returns sandbox id's drop counters, for /metrics.
func (m *Manager) Drops(id string) (Drops, error) {
	var d Drops
	c, err := m.nft()
	if err != nil {
		return d, fmt.Errorf("network: open nftables: %w", err)
	}
	for _, x := range []struct {
		suffix string
		into   *uint64
	}{{neverSuffix, &d.AlwaysDenied}, {deniedSuffix, &d.Policy}} {
		packets, err := counterPackets(c, chainOf(id)+x.suffix)
		if err != nil {
			return d, err
		}
		*x.into = packets
	}
	return d, nil
}

// Traffic returns what sandbox id's interface carried since its setup by this process, read
// from the host end's link statistics; a sandbox with no network set up here has none (an
// error wrapping fs.ErrNotExist).
func (m *Manager) Traffic(id string) (Traffic, error) {
	m.mu.Lock()
	sb := m.sandboxes[id]
	m.mu.Unlock()
	if sb == nil {
		return Traffic{}, fmt.Errorf("network: %s has no network set up by this process: %w", id, fs.ErrNotExist)
	}
	h, err := m.netlink()
	if err != nil {
		return Traffic{}, fmt.Errorf("network: open netlink: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(sb.att.Interface)
	if err != nil {
		return Traffic{}, fmt.Errorf("network: find %s: %w", sb.att.Interface, err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return Traffic{}, fmt.Errorf("network: %s has no statistics", sb.att.Interface)
	}
	// The host end receives what the sandbox sends.
	return Traffic{InBytes: st.TxBytes, OutBytes: st.RxBytes}, nil
}

// HostDrops returns how many packets sandboxes sent to the host itself (its addresses and
// bothyd's API) that were dropped, for all sandboxes together.
func (m *Manager) HostDrops() (uint64, error) {
	c, err := m.nft()
	if err != nil {
		return 0, fmt.Errorf("network: open nftables: %w", err)
	}
	return counterPackets(c, hostDenied)
}

func counterPackets(c *nftables.Conn, name string) (uint64, error) {
	o, err := c.GetObject(&nftables.NamedObj{Table: table, Name: name, Type: nftables.ObjTypeCounter})
	if err != nil {
		return 0, fmt.Errorf("network: read the counter %s: %w", name, err)
	}
	if n, ok := o.(*nftables.NamedObj); ok {
		if ctr, ok := n.Obj.(*expr.Counter); ok {
			return ctr.Packets, nil
		}
	}
	return 0, fmt.Errorf("network: the counter %s is not a counter", name)
}

// Refused returns how many names the resolvers refused, for all sandboxes together; a
// sandbox's own count is in [Manager.RefusedBy].
func (m *Manager) Refused() uint64 { return m.refused.Load() }

// RefusedBy returns how many names sandbox id's resolver refused since its setup.
func (m *Manager) RefusedBy(id string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sb := m.sandboxes[id]; sb != nil {
		return sb.refused.Load()
	}
	return 0
}

// Close stops the resolvers; it leaves the sandboxes' networks in place, for the next process
// to take over with [Manager.Setup] or remove with [Manager.Teardown].
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.sandboxes {
		sb.stopResolver()
	}
	return nil
}
