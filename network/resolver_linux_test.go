//go:build linux

package network

import (
	"net"
	"net/netip"
	"testing"
	"time"

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
