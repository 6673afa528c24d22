//go:build linux

package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The bounds of a pin's life. A TTL of a few seconds (or zero) would let the pin lapse
// between the answer and the connect, and a client that keeps an answer for a while (a
// connection pool re-dialling) would be cut off; a week-long TTL would keep an address open
// long after the name moved.
const (
	minPinTTL = 60 * time.Second
	maxPinTTL = 24 * time.Hour
)

// upstreamTimeout bounds one forwarded query.
const upstreamTimeout = 5 * time.Second

// pin is an address a sandbox's resolver answered for an allowed name, until when.
type pin struct {
	name  string
	addr  netip.Addr
	until time.Time
}

func (p pin) live() bool { return time.Until(p.until) > time.Second }

func (p pin) timeout() time.Duration { return time.Until(p.until).Round(time.Second) }

// pinComment is what a pinned set's element carries beside its address: the name it was
// answered for, read back by an adoption (inheritedPins) so that a later policy change can
// keep the pins of names it still allows. A name too long for an element's user data (the
// kernel bounds it to 256 bytes) is not carried, and its pin is not kept at an adoption.
func pinComment(name string) string {
	if len(name) > maxPinComment {
		return ""
	}
	return name
}

// maxPinComment leaves room, within the kernel's 256 bytes of an element's user data, for the
// comment's type, length and terminating NUL.
const maxPinComment = 250

func pinTTL(ttl uint32) time.Duration {
	return min(max(time.Duration(ttl)*time.Second, minPinTTL), maxPinTTL)
}

// serve starts sb's resolver on port 53 of its gateway, over UDP and TCP, with sockets opened
// in the host namespace. Each sandbox has its own listener, so a query's sandbox is known by
// where it arrived, not by a source address it could try to forge. The sockets are bound to
// the sandbox's host interface (SO_BINDTODEVICE): every gateway is an address of the host, and
// a socket bound to an address alone would take a query that another sandbox sent to it
// through its own interface. The input chain drops such a query already (localToIIF); the
// binding holds even without it. TCP connections are bounded (bounds_linux.go).
func (m *Manager) serve(sb *sandbox) error {
	sb.stopped.Store(false)
	at := netip.AddrPortFrom(sb.att.Gateway, 53).String()
	var pc net.PacketConn
	var ln net.Listener
	err := m.inHost(func() (err error) {
		lc := net.ListenConfig{Control: bindToDevice(sb.att.Interface)}
		if pc, err = lc.ListenPacket(context.Background(), "udp4", at); err != nil {
			return err
		}
		if ln, err = lc.Listen(context.Background(), "tcp4", at); err != nil {
			pc.Close()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("network: start the resolver of %s on %s: %w", sb.id, at, err)
	}
	ln = &boundedListener{Listener: ln, gates: []*gate{&sb.conns, &m.conns},
		full: func() {
			m.rl.Warn(sb.id+" conns", "network: a TCP connection to the sandbox's resolver was closed at its bound",
				"sandbox", sb.id, "per_sandbox", sb.conns.max, "all", m.conns.max)
		},
		failed: func(err error) {
			m.rl.Warn(sb.id+" accept", "network: the sandbox's resolver cannot accept a TCP connection", "sandbox", sb.id, "err", err)
		}}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) { m.answer(sb, w, q) })
	idle := func() time.Duration { return resolverIdleTimeout }
	sb.servers = []*dns.Server{{PacketConn: pc, Handler: handler},
		{Listener: ln, Handler: handler, ReadTimeout: resolverReadTimeout, IdleTimeout: idle, WriteTimeout: resolverWriteTimeout}}
	for _, s := range sb.servers {
		go func() {
			if err := s.ActivateAndServe(); err != nil && !sb.stopped.Load() {
				m.log.Warn("network: a resolver stopped", "sandbox", sb.id, "err", err)
			}
		}()
	}
	return nil
}

// stopResolver stops sb's resolver and closes its sockets. A server whose goroutine has not
// activated it yet refuses Shutdown ("server not started") and would go on to serve for the
// rest of the process on a socket nothing owns; closing the socket makes its
// ActivateAndServe return at once instead.
func (sb *sandbox) stopResolver() {
	sb.stopped.Store(true)
	for _, s := range sb.servers {
		if s.Shutdown() == nil {
			continue
		}
		if s.PacketConn != nil {
			_ = s.PacketConn.Close()
		}
		if s.Listener != nil {
			_ = s.Listener.Close()
		}
	}
	sb.servers = nil
}

// bindToDevice returns a socket control that binds the socket to the interface ifname.
func bindToDevice(ifname string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) {
			err = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifname)
		}); cerr != nil {
			return cerr
		}
		if err != nil {
			return fmt.Errorf("bind to %s: %w", ifname, err)
		}
		return nil
	}
}

// setLimits sets the resolvers' bounds, before any sandbox is set up.
func (m *Manager) setLimits(l limits) {
	m.lim = l
	m.conns.max, m.pending.max = l.conns, l.pending
}

// answer answers one query of sb: REFUSED for a name its policy does not allow, and otherwise
// the upstream's answer, once its IPv4 addresses are pinned in the sandbox's allowed set (a
// client connects right after the answer, so the pin must be in place first).
//
// A refused name gets REFUSED rather than NXDOMAIN: the name may well exist, and NXDOMAIN is
// cached as nonexistence (RFC 2308), so after a live policy change that allows it a caching
// client would still not find it; REFUSED says what happened and is not cached.
func (m *Manager) answer(sb *sandbox, w dns.ResponseWriter, q *dns.Msg) {
	reply := func(rcode int) {
		r := new(dns.Msg)
		r.SetRcode(q, rcode)
		_ = w.WriteMsg(r)
	}
	if q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 {
		reply(dns.RcodeNotImplemented)
		return
	}
	name := q.Question[0].Name
	sb.mu.Lock()
	rules := sb.rules
	sb.mu.Unlock()
	if !rules.AllowsName(name) {
		m.refused.Add(1)
		sb.refused.Add(1)
		if m.cfg.OnRefused != nil {
			m.cfg.OnRefused(sb.id, name)
		}
		reply(dns.RcodeRefused)
		return
	}
	// A query goes upstream only within the bounds of pending queries: each holds a socket
	// until the upstream answers or its timeout passes, and an upstream that never answers
	// would otherwise let a sandbox hold as many as it sends.
	if !enterAll(&sb.pending, &m.pending) {
		m.rl.Warn(sb.id+" pending", "network: a query of the sandbox was not forwarded: too many are pending upstream",
			"sandbox", sb.id, "name", name, "per_sandbox", sb.pending.max, "all", m.pending.max)
		reply(dns.RcodeServerFailure)
		return
	}
	resp, err := m.forward(q)
	leaveAll(&sb.pending, &m.pending)
	if err != nil {
		m.rl.Warn(sb.id+" upstream", "network: the upstream resolver failed", "sandbox", sb.id, "name", name, "err", err)
		reply(dns.RcodeServerFailure)
		return
	}
	if rules.pins() {
		if err := m.pinAnswers(sb, rules, name, resp); err != nil {
			m.rl.Warn(sb.id+" pin", "network: pin an answer", "sandbox", sb.id, "name", name, "err", err)
			reply(dns.RcodeServerFailure)
			return
		}
	}
	if rules.bindsName(name) {
		// As a pin: in place before the answer, since the client connects right after it.
		if err := m.interceptAnswers(sb, rules, resp); err != nil {
			m.rl.Warn(sb.id+" intercept", "network: send an answer's addresses to the egress proxy", "sandbox", sb.id, "name", name, "err", err)
			reply(dns.RcodeServerFailure)
			return
		}
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if opt := q.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		resp.Truncate(size)
	}
	_ = w.WriteMsg(resp)
}

// forward sends q to the upstream from the host namespace, over UDP and again over TCP when
// the answer was truncated.
func (m *Manager) forward(q *dns.Msg) (*dns.Msg, error) {
	var resp *dns.Msg
	for _, network := range []string{"udp", "tcp"} {
		var conn net.Conn
		err := m.inHost(func() (err error) {
			d := net.Dialer{Timeout: upstreamTimeout}
			conn, err = d.DialContext(context.Background(), network, m.cfg.Upstream)
			return err
		})
		if err != nil {
			return nil, err
		}
		c := &dns.Client{Net: network, Timeout: upstreamTimeout}
		resp, _, err = c.ExchangeWithConn(q, &dns.Conn{Conn: conn})
		conn.Close()
		if err != nil {
			return nil, err
		}
		if !resp.Truncated {
			break
		}
	}
	return resp, nil
}

// pinAnswers adds the IPv4 addresses of resp's answer to sb's pinned set, each for its TTL
// within the bounds. An address already pinned is deleted and added again in the same
// transaction, which restarts its timeout. IPv6 answers are passed on unpinned: sandboxes
// have no IPv6 path yet.
func (m *Manager) pinAnswers(sb *sandbox, rules *Rules, name string, resp *dns.Msg) error {
	var fresh []pin
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			if addr, ok := netip.AddrFromSlice(a.A.To4()); ok {
				fresh = append(fresh, pin{name: name, addr: addr, until: time.Now().Add(pinTTL(a.Hdr.Ttl))})
			}
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	// Only sb's lock is taken: Update holds it around its transaction, so a pin lands before
	// a policy change or is refused after it; taking the Manager's lock here could deadlock
	// with a Teardown that waits for this handler while holding it.
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.rules != rules {
		// The policy changed while the query was out; the answer is for a policy that is no
		// longer in force.
		return fmt.Errorf("the policy changed while %s was resolved", name)
	}
	if err := m.roomForPins(sb, fresh); err != nil {
		return err
	}
	set := ipv4Set(chainOf(sb.id)+pinnedSuffix, false, true)
	c, err := m.nft()
	if err != nil {
		return err
	}
	var del, add []nftables.SetElement
	for _, p := range fresh {
		b := p.addr.As4()
		if old, ok := sb.pins[p.addr]; ok && old.live() {
			if old.until.After(p.until) {
				continue
			}
			del = append(del, nftables.SetElement{Key: b[:]})
		}
		add = append(add, nftables.SetElement{Key: b[:], Timeout: p.timeout(), Comment: pinComment(p.name)})
	}
	if len(add) == 0 {
		return nil
	}
	if len(del) > 0 {
		if err := c.SetDeleteElements(set, del); err != nil {
			return err
		}
	}
	if err := c.SetAddElements(set, add); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("add to the pinned set: %w", err)
	}
	for _, p := range fresh {
		if old, ok := sb.pins[p.addr]; !ok || !old.until.After(p.until) {
			sb.pins[p.addr] = p
		}
	}
	return nil
}

// roomForPins makes sure that pinning fresh keeps sb within its bound of pinned addresses,
// forgetting the pins that have lapsed (the kernel's set times them out on its own) if need
// be; when they are not enough, the answer is not pinned and not given.
func (m *Manager) roomForPins(sb *sandbox, fresh []pin) error {
	added := func() int {
		n := 0
		for _, p := range fresh {
			if _, ok := sb.pins[p.addr]; !ok {
				n++
			}
		}
		return n
	}
	if len(sb.pins)+added() <= m.lim.pinsPerSandbox {
		return nil
	}
	for addr, p := range sb.pins {
		if !p.live() {
			delete(sb.pins, addr)
		}
	}
	if n := len(sb.pins) + added(); n > m.lim.pinsPerSandbox {
		return fmt.Errorf("%d addresses would be pinned, and the bound is %d", n, m.lim.pinsPerSandbox)
	}
	return nil
}

// inheritedPins reads what an earlier bothyd's resolver pinned for the sandbox id, still in its
// pinned set, and returns what of it rules allow: the pins of names it still allows, within
// the bound, each until its kernel timeout. A pin without its name (made by a bothyd before
// names were kept, or for a name too long to keep) is let go: whether the policy still allows
// it cannot be told. Without them, a sandbox's connection to an address it resolved before the restart
// would be dropped until it resolved the name again. A set that does not read gives nothing.
func (m *Manager) inheritedPins(id string, rules *Rules) []pin {
	if !rules.pins() {
		return nil
	}
	c, err := m.nft()
	if err != nil {
		return nil
	}
	elems, err := c.GetSetElements(ipv4Set(chainOf(id)+pinnedSuffix, false, true))
	if err != nil {
		return nil
	}
	now := time.Now()
	var pins []pin
	for _, e := range elems {
		if len(e.Key) != 4 || e.Expires <= time.Second || len(pins) >= m.lim.pinsPerSandbox {
			continue
		}
		if e.Comment == "" || !rules.AllowsName(e.Comment) {
			continue
		}
		pins = append(pins, pin{name: e.Comment, addr: netip.AddrFrom4([4]byte(e.Key)), until: now.Add(e.Expires)})
	}
	return pins
}
