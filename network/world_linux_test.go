//go:build linux

package network

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The tests build their own small internet, and send traffic only inside it: a "host"
// namespace where the Manager works (so that the real host's network, routes and nftables are
// never touched), an "internet" namespace behind the host's uplink with the servers, and a
// "sandbox" namespace per sandbox. Every address below is configured on an interface of a
// namespace the test made; nothing else exists in those namespaces to answer.
var (
	hostUplink  = netip.MustParsePrefix("198.51.100.1/24") // the host's end of the uplink
	netUplink   = netip.MustParsePrefix("198.51.100.2/24") // the internet's end, its DNS server
	allowedHost = netip.MustParseAddr("203.0.113.10")      // allowed.test, sub.wild.test
	otherHost   = netip.MustParseAddr("203.0.113.20")      // other.test, bad.wild.test
	cidrHost    = netip.MustParseAddr("192.0.2.30")        // inside an allowed CIDR
	deniedHost  = netip.MustParseAddr("192.0.2.31")        // inside it too, but denied
	privateHost = netip.MustParseAddr("10.9.0.5")          // a private address, private.test
	metadata    = netip.MustParseAddr("169.254.169.254")   // the cloud metadata address
	hostAPIPort = 7780
)

var zone = map[string]netip.Addr{
	"allowed.test.":  allowedHost,
	"other.test.":    otherHost,
	"sub.wild.test.": allowedHost,
	"bad.wild.test.": otherHost,
	"private.test.":  privateHost,
	"meta.test.":     metadata,
	"cidr.test.":     cidrHost,
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network tests need root: they make network namespaces, veth pairs and nftables tables")
	}
}

// inNS runs fn on a thread in ns; sockets fn opens stay in ns.
func inNS(t *testing.T, ns *os.File, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(netns.NsHandle(ns.Fd())); err != nil {
			errc <- err
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// newNS makes an empty network namespace, destroyed when the test ends (closing the last
// reference destroys it, and the interfaces in it).
func newNS(t *testing.T) *os.File {
	t.Helper()
	fc := make(chan *os.File, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			errc <- err
			return
		}
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		fc <- os.NewFile(uintptr(ns), "netns")
	}()
	select {
	case f := <-fc:
		t.Cleanup(func() { f.Close() })
		return f
	case err := <-errc:
		t.Fatalf("make a network namespace: %v", err)
	}
	return nil
}

func handleIn(t *testing.T, ns *os.File) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func linkUp(t *testing.T, h *netlink.Handle, name string, addrs ...netip.Prefix) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	must(t, err)
	for _, a := range addrs {
		must(t, h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(a.Addr(), a.Bits())}))
	}
	must(t, h.LinkSetUp(l))
	return l
}

// world is the test's internet: host and internet namespaces, the servers, and a Manager.
type world struct {
	host, inet *os.File
	m          *Manager
	dir        string

	mu    sync.Mutex
	asked []string // the names the internet's DNS server was asked, as it saw them
}

// upstreamAsked returns the names the internet's DNS server was asked so far.
func (w *world) upstreamAsked() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.asked)
}

func newWorld(t *testing.T) *world {
	t.Helper()
	needRoot(t)
	w := &world{host: newNS(t), inet: newNS(t), dir: t.TempDir()}
	hh, ih := handleIn(t, w.host), handleIn(t, w.inet)
	must(t, hh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up1",
		PeerNamespace: netlink.NsFd(int(w.inet.Fd()))}))
	linkUp(t, hh, "lo")
	up0 := linkUp(t, hh, "up0", hostUplink)
	must(t, hh.RouteAdd(&netlink.Route{LinkIndex: up0.Attrs().Index, Gw: netUplink.Addr().AsSlice()}))
	var hosts []netip.Prefix
	for _, a := range []netip.Addr{allowedHost, otherHost, cidrHost, deniedHost, privateHost, metadata} {
		hosts = append(hosts, netip.PrefixFrom(a, 32))
	}
	linkUp(t, ih, "lo", hosts...)
	linkUp(t, ih, "up1", netUplink)

	// The internet serves HTTP on port 80 of all its addresses, saying which one answered,
	// and DNS for the test zone.
	serveHTTP(t, w.inet, ":80")
	serveHTTP(t, w.host, fmt.Sprintf(":%d", hostAPIPort)) // the host's own service, bothyd's API say
	var pc net.PacketConn
	must(t, inNS(t, w.inet, func() (err error) {
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(netUplink.Addr(), 53).String())
		return err
	}))
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, q *dns.Msg) {
		if len(q.Question) == 1 {
			w.mu.Lock()
			w.asked = append(w.asked, q.Question[0].Name)
			w.mu.Unlock()
		}
		serveZone(rw, q)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })

	m, err := New(Config{Dir: w.dir, HostNS: w.host, Upstream: netip.AddrPortFrom(netUplink.Addr(), 53).String(), Uplink: "up0", Log: quiet})
	must(t, err)
	t.Cleanup(func() { m.Close() })
	w.m = m
	return w
}

func serveHTTP(t *testing.T, ns *os.File, at string) {
	t.Helper()
	var ln net.Listener
	must(t, inNS(t, ns, func() (err error) { ln, err = net.Listen("tcp4", at); return err }))
	s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Context().Value(http.LocalAddrContextKey).(net.Addr).String())
	})}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
}

// serveZone answers the test zone; names below blackhole.test get no answer at all, as from
// an upstream that is down or slow.
func serveZone(w dns.ResponseWriter, q *dns.Msg) {
	r := new(dns.Msg)
	r.SetReply(q)
	name := strings.ToLower(q.Question[0].Name)
	if strings.HasSuffix(name, ".blackhole.test.") {
		return
	}
	addr, ok := zone[name]
	switch {
	case !ok:
		r.Rcode = dns.RcodeNameError
	case q.Question[0].Qtype == dns.TypeA:
		r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
			A: addr.AsSlice()})
	}
	w.WriteMsg(r)
}

// testSandbox is a sandbox's namespace as the tests see it.
type testSandbox struct {
	t   *testing.T
	ns  *os.File
	att Attachment
}

func (w *world) sandbox(t *testing.T, id string, p Policy) *testSandbox {
	t.Helper()
	ns := newNS(t)
	rules, err := Parse(p)
	must(t, err)
	t.Cleanup(func() {
		if err := w.m.Teardown(id); err != nil {
			t.Errorf("teardown %s: %v", id, err)
		}
	})
	att, err := w.m.Setup(id, Target{NS: ns}, rules)
	must(t, err)
	return &testSandbox{t: t, ns: ns, att: att}
}

// get fetches http://addr:port/ from inside the sandbox and returns the body, or the error.
// A refused destination is dropped, not rejected, so a short timeout stands for "dropped".
func (s *testSandbox) get(addr netip.Addr, port int) (string, error) {
	var conn net.Conn
	err := inNS(s.t, s.ns, func() (err error) {
		conn, err = net.DialTimeout("tcp4", netip.AddrPortFrom(addr, uint16(port)).String(), 700*time.Millisecond)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", err
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return body, nil
}

// resolve asks the sandbox's resolver for name's A records, from inside the sandbox.
func (s *testSandbox) resolve(name string) (int, []netip.Addr) {
	s.t.Helper()
	var conn net.Conn
	must(s.t, inNS(s.t, s.ns, func() (err error) {
		conn, err = net.Dial("udp4", netip.AddrPortFrom(s.att.Gateway, 53).String())
		return err
	}))
	defer conn.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	c := &dns.Client{Timeout: 5 * time.Second}
	r, _, err := c.ExchangeWithConn(q, &dns.Conn{Conn: conn})
	must(s.t, err)
	var addrs []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			addr, _ := netip.AddrFromSlice(a.A.To4())
			addrs = append(addrs, addr)
		}
	}
	return r.Rcode, addrs
}

func (s *testSandbox) links() []string {
	s.t.Helper()
	var names []string
	links, err := handleIn(s.t, s.ns).LinkList()
	must(s.t, err)
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names
}

// quiet drops the Manager's log lines, which would bury a failure's message.
var quiet = slog.New(slog.DiscardHandler)
