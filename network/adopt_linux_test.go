//go:build linux

package network

import (
	"net"
	"net/netip"
	"sync"
	"testing"
)

// fakeEgress stands for the egress proxy: it keeps each sandbox's listener and its question
// of which destinations may be dialled. closeAll is what the death of bothyd does to them.
type fakeEgress struct {
	mu      sync.Mutex
	lns     map[string]net.Listener
	allowed map[string]func(netip.AddrPort) bool
}

func newFakeEgress() *fakeEgress {
	return &fakeEgress{lns: map[string]net.Listener{}, allowed: map[string]func(netip.AddrPort) bool{}}
}

func (e *fakeEgress) Serve(id string, ln net.Listener, _ []SecretBinding, allowed func(netip.AddrPort) bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lns[id], e.allowed[id] = ln, allowed
	return nil
}

func (e *fakeEgress) Update(string, []SecretBinding) {}

func (e *fakeEgress) Stop(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ln := e.lns[id]; ln != nil {
		ln.Close()
	}
	delete(e.lns, id)
}

func (e *fakeEgress) closeAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ln := range e.lns {
		ln.Close()
	}
}

func (e *fakeEgress) intercepts(id string, dst netip.Addr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.allowed[id]
	return f != nil && f(netip.AddrPortFrom(dst, 443))
}

// TestAdoptionKeepsPinsAndIntercepts: a Manager of a new process that adopts a sandbox keeps
// what the earlier one's resolver pinned for names the policy still allows, and the intercept
// entries whose destination the filter still lets it reach (the egress proxy is asked again
// and agrees) and that are pinned for a bound name; a pin keeps its name across adoptions and
// a live update; a first set-up keeps nothing. Without the adoption's keeping, the address the sandbox resolved is dropped and
// the bound one not intercepted.
func TestAdoptionKeepsPinsAndIntercepts(t *testing.T) {
	w := newWorld(t)
	bound := []SecretBinding{{Secret: "KEY", Hosts: []string{"allowed.test"}}}
	var s *testSandbox
	restart := func(eg *fakeEgress) *fakeEgress {
		t.Helper()
		// The earlier process dies: its resolvers and its proxy's listeners go with it. A
		// resolver is shut down only once it serves (miekg/dns refuses to shut down a server
		// that has not started), so the sandbox is first answered by it: a refused name pins
		// and intercepts nothing.
		if s != nil {
			s.refused("not-allowed.test")
		}
		w.m.Close()
		if eg != nil {
			eg.closeAll()
		}
		next := newFakeEgress()
		m, err := New(Config{Dir: w.dir, HostNS: w.host, Upstream: netip.AddrPortFrom(netUplink.Addr(), 53).String(),
			Uplink: "up0", Log: quiet, Egress: next})
		must(t, err)
		t.Cleanup(func() { m.Close() })
		w.m = m
		return next
	}
	rules := func(p Policy) *Rules {
		t.Helper()
		r, err := Parse(p)
		must(t, err)
		return r
	}
	setup := func(s *testSandbox, r *Rules, adopt bool) {
		t.Helper()
		_, err := w.m.Setup("box", Target{NS: s.ns, Adopt: adopt}, r)
		must(t, err)
	}

	eg := restart(nil)
	s = w.sandbox(t, "box", Policy{Allow: []string{"allowed.test", "other.test"}, Secrets: bound})
	s.resolves("allowed.test", allowedHost.String())
	s.resolves("other.test", otherHost.String())
	if !eg.intercepts("box", allowedHost) || eg.intercepts("box", otherHost) {
		t.Fatal("before any restart: want allowed.test's address intercepted, and other.test's not")
	}

	// Adopted under a policy that no longer allows other.test: allowed.test's pin and
	// interception stay, other.test's pin goes.
	narrow := rules(Policy{Allow: []string{"allowed.test"}, Secrets: bound})
	eg = restart(eg)
	setup(s, narrow, true)
	s.reachable(allowedHost.String(), 80)
	s.unreachable(otherHost.String(), 80)
	if !eg.intercepts("box", allowedHost) {
		t.Fatal("after an adoption the proxy refuses the address the sandbox resolved for the bound name")
	}

	// Adopted under a policy that denies that address: the pin's name is allowed still, but
	// the interception goes, from the kernel's set too.
	eg = restart(eg)
	setup(s, rules(Policy{Allow: []string{"allowed.test"}, Deny: []string{allowedHost.String() + "/32"}, Secrets: bound}), true)
	if eg.intercepts("box", allowedHost) {
		t.Fatal("an adoption kept an interception of an address the policy denies")
	}
	eg = restart(eg)
	setup(s, narrow, true)
	if eg.intercepts("box", allowedHost) {
		t.Fatal("an interception dropped at one adoption came back at the next: it was not removed from the kernel's set")
	}

	// The pin kept its name through two adoptions: a live update keeps it.
	must(t, w.m.Update("box", narrow))
	s.reachable(allowedHost.String(), 80)

	// A first set-up (not an adoption) starts empty.
	eg = restart(eg)
	setup(s, narrow, false)
	s.unreachable(allowedHost.String(), 80)
	if eg.intercepts("box", allowedHost) {
		t.Fatal("a first set-up kept an interception")
	}

	// Resolved again, then adopted under a policy that still binds allowed.test but no longer
	// allows the name: its pin goes, and so must its interception, or the proxy would dial an
	// address the filter no longer lets the sandbox reach (a redirected connection never meets
	// the filter).
	s.resolves("allowed.test", allowedHost.String())
	if !eg.intercepts("box", allowedHost) {
		t.Fatal("resolved again, allowed.test's address is not intercepted")
	}
	eg = restart(eg)
	setup(s, rules(Policy{Allow: []string{"other.test"}, Secrets: bound}), true)
	s.unreachable(allowedHost.String(), 80)
	if eg.intercepts("box", allowedHost) {
		t.Fatal("an adoption kept an interception of an address whose name the policy no longer allows")
	}
}
