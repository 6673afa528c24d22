//go:build linux

package network

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
)

func (s *testSandbox) reachable(addr string, port int) {
	s.t.Helper()
	body, err := s.get(netipAddr(addr), port)
	if err != nil || !strings.Contains(body, addr) {
		s.t.Fatalf("GET %s:%d from the sandbox = %q, %v; want an answer from %s", addr, port, body, err, addr)
	}
}

func (s *testSandbox) unreachable(addr string, port int) {
	s.t.Helper()
	if body, err := s.get(netipAddr(addr), port); err == nil {
		s.t.Fatalf("GET %s:%d from the sandbox answered %q; want it dropped", addr, port, body)
	}
}

func (s *testSandbox) resolves(name, want string) {
	s.t.Helper()
	rcode, addrs := s.resolve(name)
	if rcode != dns.RcodeSuccess || len(addrs) != 1 || addrs[0].String() != want {
		s.t.Fatalf("resolve %s = %s %v; want NOERROR %s", name, dns.RcodeToString[rcode], addrs, want)
	}
}

func (s *testSandbox) refused(name string) {
	s.t.Helper()
	if rcode, addrs := s.resolve(name); rcode != dns.RcodeRefused || len(addrs) != 0 {
		s.t.Fatalf("resolve %s = %s %v; want REFUSED", name, dns.RcodeToString[rcode], addrs)
	}
}

func netipAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func drops(t *testing.T, m *Manager, id string) Drops {
	t.Helper()
	d, err := m.Drops(id)
	must(t, err)
	return d
}

func TestNoInterfaceByDefault(t *testing.T) {
	w := newWorld(t)
	s := &testSandbox{t: t, ns: newNS(t)}
	if got := s.links(); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("a sandbox namespace has %v; want only lo", got)
	}
	rules, err := Parse(Policy{Deny: []string{"example.com"}})
	must(t, err)
	if _, err := w.m.Setup("quiet", Target{NS: s.ns}, rules); err == nil {
		t.Fatal("Setup of a policy that allows nothing made a network")
	}
	if got := s.links(); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("after a refused Setup the sandbox has %v; want only lo", got)
	}
}

func TestEgressByPolicy(t *testing.T) {
	w := newWorld(t)
	refusedNames := make(chan string, 16)
	w.m.cfg.OnRefused = func(id, name string) { refusedNames <- id + " " + name }
	s := w.sandbox(t, "box", Policy{
		Allow: []string{"allowed.test", "*.wild.test", "192.0.2.0/24"},
		Deny:  []string{"bad.wild.test", "192.0.2.31"},
	})
	if got := s.links(); !slices.Contains(got, "eth0") {
		t.Fatalf("the sandbox has %v; want eth0", got)
	}

	t.Run("allowed domain", func(t *testing.T) {
		s.t = t
		s.resolves("allowed.test", "203.0.113.10")
		s.reachable("203.0.113.10", 80)
		s.resolves("sub.wild.test", "203.0.113.10")
	})
	t.Run("refused name and its address", func(t *testing.T) {
		s.t = t
		before := drops(t, w.m, "box")
		s.refused("other.test")
		if got := <-refusedNames; got != "box other.test." {
			t.Errorf("OnRefused got %q, want the sandbox and the name", got)
		}
		s.unreachable("203.0.113.20", 80)
		if after := drops(t, w.m, "box"); after.Policy <= before.Policy {
			t.Errorf("policy drops %d then %d; want the direct dial counted", before.Policy, after.Policy)
		}
		if w.m.RefusedBy("box") == 0 || w.m.Refused() == 0 {
			t.Errorf("refused counters %d and %d; want the refusal counted", w.m.RefusedBy("box"), w.m.Refused())
		}
	})
	t.Run("deny over allow", func(t *testing.T) {
		s.t = t
		s.refused("bad.wild.test")
		s.reachable("192.0.2.30", 80) // the CIDR rule
		s.unreachable("192.0.2.31", 80)
	})
	t.Run("private names are resolved but not reachable", func(t *testing.T) {
		s.t = t
		w.update(t, "box", Policy{Allow: []string{"private.test"}})
		s.resolves("private.test", "10.9.0.5")
		s.unreachable("10.9.0.5", 80)
	})
	t.Run("live update", func(t *testing.T) {
		s.t = t
		w.update(t, "box", Policy{Allow: []string{"other.test", "*.wild.test"}})
		s.unreachable("203.0.113.10", 80) // pinned for allowed.test, which is no longer allowed
		s.refused("allowed.test")
		s.resolves("other.test", "203.0.113.20")
		s.reachable("203.0.113.20", 80)
		// sub.wild.test is still allowed, so its answer stays pinned through a second update.
		s.resolves("sub.wild.test", "203.0.113.10")
		w.update(t, "box", Policy{Allow: []string{"*.wild.test"}})
		s.reachable("203.0.113.10", 80)
		s.unreachable("203.0.113.20", 80)
	})
	t.Run("internet", func(t *testing.T) {
		s.t = t
		w.update(t, "box", Policy{Internet: true, Deny: []string{"other.test"}})
		s.reachable("203.0.113.20", 80) // a denied name is refused at DNS; its address is public
		s.refused("other.test")
		s.resolves("meta.test", "169.254.169.254")
		s.unreachable("10.9.0.5", 80) // private, and no CIDR names it
		w.update(t, "box", Policy{Internet: true, Allow: []string{"10.9.0.0/24"}})
		s.reachable("10.9.0.5", 80)
		s.unreachable("203.0.113.20", 80) // with an allow list, only what it lists
	})
	t.Run("never reachable", func(t *testing.T) {
		s.t = t
		w.update(t, "box", Policy{Internet: true, Allow: []string{"0.0.0.0/0"}})
		s.reachable("203.0.113.20", 80)
		before := drops(t, w.m, "box")
		s.unreachable("169.254.169.254", 80)
		after := drops(t, w.m, "box")
		if after.AlwaysDenied <= before.AlwaysDenied {
			t.Errorf("always-denied drops %d then %d; want the metadata dial dropped by the never rule", before.AlwaysDenied, after.AlwaysDenied)
		}
		hostBefore, err := w.m.HostDrops()
		must(t, err)
		s.unreachable(s.att.Gateway.String(), hostAPIPort)
		s.unreachable(hostUplink.Addr().String(), hostAPIPort)
		if hostAfter, err := w.m.HostDrops(); err != nil || hostAfter <= hostBefore {
			t.Errorf("host drops %d then %d (%v); want the dials to the host counted", hostBefore, hostAfter, err)
		}
	})
}

func (w *world) update(t *testing.T, id string, p Policy) {
	t.Helper()
	rules, err := Parse(p)
	must(t, err)
	must(t, w.m.Update(id, rules))
}

func TestSandboxesApart(t *testing.T) {
	w := newWorld(t)
	a := w.sandbox(t, "a", Policy{Internet: true})
	b := w.sandbox(t, "b", Policy{Internet: true})
	serveHTTP(t, b.ns, ":80")
	a.reachable("203.0.113.10", 80)
	a.unreachable(b.att.Address.String(), 80)
	if d := drops(t, w.m, "a"); d.AlwaysDenied == 0 {
		t.Errorf("drops %+v; want the dial to another sandbox dropped as always denied", d)
	}
}

func TestTeardownLeavesNothing(t *testing.T) {
	w := newWorld(t)
	s := w.sandbox(t, "gone", Policy{Allow: []string{"allowed.test"}})
	s.resolves("allowed.test", "203.0.113.10")
	must(t, w.m.Teardown("gone"))
	must(t, w.m.Teardown("gone")) // idempotent
	w.assertClean(t)
	if got := s.links(); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("after Teardown the sandbox has %v; want only lo", got)
	}
}

// assertClean fails unless nothing of any sandbox is left: no interface, chain, set, counter,
// gateway or record.
func (w *world) assertClean(t *testing.T) {
	t.Helper()
	links, err := handleIn(t, w.host).LinkList()
	must(t, err)
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, ifPrefix) {
			t.Errorf("interface %s left", l.Attrs().Name)
		}
	}
	st, err := w.m.state()
	must(t, err)
	if len(st.chains)+len(st.sets)+len(st.counters)+len(st.dispatch)+len(st.gateways)+len(st.intercepted) != 0 {
		t.Errorf("nftables objects left: %+v", st)
	}
	entries, err := os.ReadDir(w.dir)
	must(t, err)
	for _, e := range entries {
		t.Errorf("record %s left", e.Name())
	}
}

func TestLeftoversAndRepair(t *testing.T) {
	w := newWorld(t)
	w.sandbox(t, "crashed", Policy{Internet: true})
	w.sandbox(t, "orphan", Policy{Internet: true})
	live := w.sandbox(t, "live", Policy{Internet: true})

	// A new process finds what the last one made: the record of "crashed" has no live owner,
	// and "orphan" lost its record (say, to an operator), so its objects have none.
	must(t, os.Remove(filepath.Join(w.dir, "orphan.json")))
	must(t, os.WriteFile(filepath.Join(w.dir, ".live.json.0123456789abcdef.tmp"), nil, 0o600))
	// An egress redirection of an address no record names, as a crash between an answer and
	// the teardown of its sandbox leaves it.
	stray := netip.MustParseAddr("10.88.200.2")
	c, err := w.m.nft()
	must(t, err)
	must(t, c.SetAddElements(interceptSetOf(), []nftables.SetElement{{Key: interceptKey(stray, netip.MustParseAddr("203.0.113.10")), Timeout: time.Hour}}))
	must(t, c.Flush())
	m2, err := New(Config{Dir: w.dir, HostNS: w.host, Upstream: w.m.cfg.Upstream, Uplink: "up0", Log: quiet})
	must(t, err)
	isLive := func(id string) bool { return id == "live" }
	l, err := m2.Leftovers(isLive)
	must(t, err)
	if !slices.Equal(l.Records, []string{"crashed"}) || len(l.Interfaces) != 1 || !slices.Equal(l.Chains, []string{"sb-orphan"}) ||
		len(l.Sets) != len(setSuffixes) || len(l.Counters) != len(counterSuffixes) || len(l.Gateways) != 1 || len(l.Temp) != 1 ||
		!slices.Equal(l.Intercepts, []netip.Addr{stray}) {
		t.Fatalf("Leftovers =\n%s(%+v)\nwant the crashed record, and the orphan's interface, chain, sets, counters and gateway, the stray redirection and the temp file", l, l)
	}
	must(t, m2.Repair(l))
	if l, err := m2.Leftovers(isLive); err != nil || !l.Empty() {
		t.Fatalf("after Repair: %s%v; want nothing left", l, err)
	}
	live.reachable("203.0.113.10", 80) // a live sandbox keeps its network
	if _, err := netlinkLink(t, w, live.att.Interface); err != nil {
		t.Fatalf("the live sandbox's interface is gone: %v", err)
	}
	must(t, w.m.Teardown("live"))
	w.assertClean(t)
}

// TestRecordedRemovesInterruptedWrites: the start-up's listing of the records removes what
// an interrupted record write left (a SIGKILL between the temporary file and its rename),
// which no repair would otherwise take away, and lists the records as they are.
func TestRecordedRemovesInterruptedWrites(t *testing.T) {
	w := newWorld(t)
	w.sandbox(t, "kept", Policy{Internet: true})
	tmp := filepath.Join(w.dir, ".cut.json.0123456789abcdef.tmp")
	must(t, os.WriteFile(tmp, []byte("{"), 0o600))
	m2, err := New(Config{Dir: w.dir, HostNS: w.host, Upstream: w.m.cfg.Upstream, Uplink: "up0", Log: quiet})
	must(t, err)
	ids, err := m2.Recorded()
	if err != nil || !slices.Equal(ids, []string{"kept"}) {
		t.Fatalf("Recorded = %v, %v; want [kept]", ids, err)
	}
	if _, err := os.Lstat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the interrupted write is still there: %v", err)
	}
	if l, err := m2.Leftovers(func(id string) bool { return id == "kept" }); err != nil || len(l.Temp) != 0 {
		t.Fatalf("Leftovers after Recorded: %s%v", l, err)
	}
	must(t, w.m.Teardown("kept"))
	w.assertClean(t)
}

func netlinkLink(t *testing.T, w *world, name string) (netlink.Link, error) {
	return handleIn(t, w.host).LinkByName(name)
}

func TestFailedSetupIsRecordedAndTornDown(t *testing.T) {
	w := newWorld(t)
	rules, err := Parse(Policy{Internet: true})
	must(t, err)
	// A pid that names no process: the plumbing fails after the allocation was recorded.
	_, err = w.m.Setup("early", Target{PID: 1 << 30}, rules)
	if err == nil {
		t.Fatal("Setup with a missing namespace succeeded")
	}
	l, err := w.m.Leftovers(func(string) bool { return false })
	must(t, err)
	if !slices.Equal(l.Records, []string{"early"}) {
		t.Fatalf("Leftovers after a failed setup = %+v; want its record, made before anything else", l)
	}
	must(t, w.m.Teardown("early"))
	w.assertClean(t)
}

// TestForgedSourcesAreDropped: root in a sandbox can give its eth0 any address and send from
// it. A datagram whose source is another sandbox's address (which the pool's masquerade would
// carry out as the host's) or an outside one must not leave the host; one from the sandbox's
// own address, sent after them on the same path, arrives, so the forged ones would have too.
func TestForgedSourcesAreDropped(t *testing.T) {
	w := newWorld(t)
	a := w.sandbox(t, "a", Policy{Internet: true})
	b := w.sandbox(t, "b", Policy{Internet: true})
	var pc net.PacketConn
	must(t, inNS(t, w.inet, func() (err error) {
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(allowedHost, 9999).String())
		return err
	}))
	defer pc.Close()

	ah := handleIn(t, a.ns)
	eth0, err := ah.LinkByName("eth0")
	must(t, err)
	forged := []netip.Addr{b.att.Address, netipAddr("192.0.2.99")}
	for _, f := range forged {
		must(t, ah.AddrAdd(eth0, &netlink.Addr{IPNet: ipnet(f, 32)}))
	}
	send := func(from netip.Addr, payload string) {
		t.Helper()
		must(t, inNS(t, a.ns, func() error {
			c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)),
				net.UDPAddrFromAddrPort(netip.AddrPortFrom(allowedHost, 9999)))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(payload))
			return err
		}))
	}
	for _, f := range forged {
		send(f, "forged "+f.String())
	}
	send(a.att.Address, "own")
	must(t, pc.SetReadDeadline(time.Now().Add(10*time.Second)))
	// The first datagram to arrive must be the last one sent: a forged one, sent before it
	// on the same path, would have come first.
	buf := make([]byte, 64)
	n, from, err := pc.ReadFrom(buf)
	if err != nil {
		t.Fatalf("the datagram from the sandbox's own address did not arrive: %v", err)
	}
	if got := string(buf[:n]); got != "own" {
		t.Fatalf("a datagram with a forged source left the host: %q (seen from %s)", got, from)
	}
}
