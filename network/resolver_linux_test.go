//go:build linux

package network

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
)

// ask sends one query for name's A records, from inside the sandbox, to port 53 of server over
// network ("udp" or "tcp"), and returns the answer's rcode, or the error when none came
// within timeout.
func (s *testSandbox) ask(server netip.Addr, network, name string, timeout time.Duration) (int, error) {
	s.t.Helper()
	var conn net.Conn
	err := inNS(s.t, s.ns, func() (err error) {
		conn, err = net.DialTimeout(network+"4", netip.AddrPortFrom(server, 53).String(), timeout)
		return err
	})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	c := &dns.Client{Net: network, Timeout: timeout}
	r, _, err := c.ExchangeWithConn(q, &dns.Conn{Conn: conn})
	if err != nil {
		return 0, err
	}
	return r.Rcode, nil
}

// TestResolverAnswersOnlyItsSandbox: every gateway is an address of the host, so a sandbox
// can send a query to another sandbox's gateway. Issue 37 item 1: such a query was answered,
// under the other sandbox's policy. It must get no answer at all, from the input chain and,
// with that rule gone, from the resolver's sockets being bound to their interface; the
// sandbox's own resolver answers under its own policy throughout.
func TestResolverAnswersOnlyItsSandbox(t *testing.T) {
	w := newWorld(t)
	narrow := w.sandbox(t, "narrow", Policy{Allow: []string{"allowed.test"}})
	open := w.sandbox(t, "open", Policy{Internet: true})
	open.resolves("other.test", otherHost.String())

	check := func(t *testing.T, filtered bool) {
		narrow.t = t
		narrow.resolves("allowed.test", allowedHost.String())
		narrow.refused("other.test")
		dropped, err := w.m.HostDrops()
		must(t, err)
		for _, network := range []string{"udp", "tcp"} {
			rcode, err := narrow.ask(open.att.Gateway, network, "other.test.", time.Second)
			if err == nil {
				t.Errorf("a query over %s from narrow to open's resolver (%s) was answered %s; want no answer",
					network, open.att.Gateway, dns.RcodeToString[rcode])
			}
		}
		if after, err := w.m.HostDrops(); filtered && (err != nil || after <= dropped) {
			t.Errorf("host drops %d then %d (%v); want the queries to open's resolver dropped by the input chain", dropped, after, err)
		}
		n := 0
		for _, name := range w.upstreamAsked() {
			if name == "other.test." {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the upstream was asked other.test. %d times; want once, for open's own query", n)
		}
	}
	t.Run("filtered", func(t *testing.T) { check(t, true) })

	// Without the input chain's rule (a host whose own firewall accepts before bothyd's
	// table would not bring it back, as a drop anywhere is final; this takes the rule away
	// altogether), the resolvers' sockets still take only their own interface's queries.
	c, err := w.m.nft()
	must(t, err)
	_, input, _ := baseChains()
	c.FlushChain(input)
	c.AddRule(&nftables.Rule{Table: table, Chain: input, Exprs: []expr.Any{accept}})
	must(t, c.Flush())
	t.Run("unfiltered", func(t *testing.T) { check(t, false) })
}

// TestResolverRefusesNamesThatAreNotHostNames: issue 37 item 6. miekg/dns presents a label's
// dot escaped, so `evil\.wild.test.` is the two labels "evil.wild" and "test": a name outside
// wild.test whose text ends in ".wild.test". It was forwarded under "*.wild.test". Such names
// are refused, and the upstream never sees them.
func TestResolverRefusesNamesThatAreNotHostNames(t *testing.T) {
	w := newWorld(t)
	s := w.sandbox(t, "box", Policy{Allow: []string{"*.wild.test"}})
	s.resolves("sub.wild.test", allowedHost.String())
	for _, name := range []string{`evil\.wild.test.`, `evil\.com.sub.wild.test.`, `a\000b.wild.test.`, `a\ b.wild.test.`} {
		for _, network := range []string{"udp", "tcp"} {
			rcode, err := s.ask(s.att.Gateway, network, name, 5*time.Second)
			if err != nil || rcode != dns.RcodeRefused {
				t.Errorf("%s over %s = %s, %v; want REFUSED", name, network, dns.RcodeToString[rcode], err)
			}
		}
	}
	for _, name := range w.upstreamAsked() {
		if name != "sub.wild.test." {
			t.Errorf("the upstream was asked %q", name)
		}
	}
}
