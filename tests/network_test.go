package tests

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/platform"
)

// The network tests build their own small internet out of network namespaces they make, and
// send traffic only inside it: bothyd runs in a "host" namespace of the test's (so its
// uplink, NAT and nftables are never the real host's), behind which an "internet" namespace
// holds an HTTP server on every test address (169.254.169.254 included, so that the only thing
// that could answer a leak is the test's own namespace) and a DNS server for a test zone,
// which bothyd's --dns-upstream names. The test reaches bothyd's API through sockets made
// inside the host namespace.
var (
	netHostUplink = netip.MustParsePrefix("198.51.100.1/24") // the host's end of its uplink
	netInetUplink = netip.MustParsePrefix("198.51.100.2/24") // the internet's end, its DNS server
	netAllowed    = "203.0.113.10"                           // allowed.test
	netOther      = "203.0.113.20"                           // other.test
	netCIDRHost   = "192.0.2.30"                             // inside an allowed CIDR
	netDeniedHost = "192.0.2.31"                             // inside it too, but denied
	netMetadata   = "169.254.169.254"                        // the cloud metadata address
	netHostPort   = 8080                                     // a service of the host's own
)

var netZone = map[string]string{"allowed.test.": netAllowed, "other.test.": netOther}

// inNetNS starts bothyd inside ns and talks to it through sockets made there.
func inNetNS(ns *os.File) daemonOption { return func(d *daemon) { d.netns = ns } }

// startCmd starts d.cmd, inside d.netns when there is one (startIn).
func (d *daemon) startCmd() error { return startIn(d.netns, d.cmd) }

// startIn starts cmd inside the network namespace ns, or where the test runs if ns is nil:
// the child inherits the network namespace of the thread that forks it, and that thread is
// never returned to the pool.
func startIn(ns *os.File, cmd *exec.Cmd) error {
	if ns == nil {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := netns.Set(netns.NsHandle(ns.Fd())); err != nil {
			errc <- err
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// httpClient is the client for d's API: the default one, or one whose sockets are made in
// d.netns, one per namespace, so that its idle connections are reused rather than left open
// on both sides at every request (TestNetworkResolvers counts bothyd's descriptors).
func (d *daemon) httpClient() *http.Client {
	if d.netns == nil {
		return http.DefaultClient
	}
	ns := d.netns
	if c, ok := nsClients.Load(ns); ok {
		return c.(*http.Client)
	}
	c, _ := nsClients.LoadOrStore(ns, &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, netw, addr string) (net.Conn, error) {
			var c net.Conn
			err := runInNS(ns, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, netw, addr)
				return err
			})
			return c, err
		},
	}})
	return c.(*http.Client)
}

// nsClients are the clients of httpClient, by namespace.
var nsClients sync.Map

// runInNS runs fn on a thread in ns; sockets it makes stay in ns.
func runInNS(ns *os.File, fn func() error) error {
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

// newTestNS makes an empty network namespace, destroyed when the test ends (with the last
// reference) along with its interfaces.
func newTestNS(t *testing.T) *os.File {
	t.Helper()
	var f *os.File
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
		f = os.NewFile(uintptr(ns), "netns")
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("make a network namespace: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func nsHandle(t *testing.T, ns *os.File) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func nsLinkUp(t *testing.T, h *netlink.Handle, name string, addrs ...netip.Prefix) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ipn := &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), 32)}
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return l
}

// netWorld is the test's internet: the host namespace bothyd runs in and the internet
// behind it.
type netWorld struct {
	host, inet *os.File
}

// daemon puts bothyd in w's host namespace, with w's uplink and the internet's resolver as
// its upstream.
func (w *netWorld) daemon() daemonOption {
	return func(d *daemon) {
		inNetNS(w.host)(d)
		withArgs(netUplinkArgs()...)(d)
	}
}

// netUplinkArgs are bothyd's arguments for the netWorld's uplink and upstream resolver.
func netUplinkArgs() []string {
	return []string{"--dns-upstream", netip.AddrPortFrom(netInetUplink.Addr(), 53).String(), "--network-uplink", "up0"}
}

func newNetWorld(t *testing.T) *netWorld {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the network tests need root: they make network namespaces, veth pairs and nftables tables")
	}
	return newNetWorldIn(t, newTestNS(t))
}

// newNetWorldIn is newNetWorld with host as the host namespace (one a test made already,
// such as a cluster node's).
func newNetWorldIn(t *testing.T, host *os.File) *netWorld {
	t.Helper()
	w := &netWorld{host: host, inet: newTestNS(t)}
	hh, ih := nsHandle(t, w.host), nsHandle(t, w.inet)
	if err := hh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up1",
		PeerNamespace: netlink.NsFd(int(w.inet.Fd()))}); err != nil {
		t.Fatal(err)
	}
	nsLinkUp(t, hh, "lo")
	up0 := nsLinkUp(t, hh, "up0", netHostUplink)
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: up0.Attrs().Index, Gw: netInetUplink.Addr().AsSlice()}); err != nil {
		t.Fatal(err)
	}
	var hosts []netip.Prefix
	for _, a := range []string{netAllowed, netOther, netCIDRHost, netDeniedHost, netMetadata} {
		hosts = append(hosts, netip.PrefixFrom(netip.MustParseAddr(a), 32))
	}
	nsLinkUp(t, ih, "lo", hosts...)
	nsLinkUp(t, ih, "up1", netInetUplink)

	serveHTTPIn(t, w.inet, ":80")
	serveHTTPIn(t, w.host, fmt.Sprintf(":%d", netHostPort))
	var pc net.PacketConn
	if err := runInNS(w.inet, func() (err error) {
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(netInetUplink.Addr(), 53).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(serveTestZone)}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return w
}

func serveHTTPIn(t *testing.T, ns *os.File, at string) {
	t.Helper()
	var ln net.Listener
	if err := runInNS(ns, func() (err error) { ln, err = net.Listen("tcp4", at); return err }); err != nil {
		t.Fatal(err)
	}
	s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Context().Value(http.LocalAddrContextKey).(net.Addr).String())
	})}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
}

func serveTestZone(w dns.ResponseWriter, q *dns.Msg) {
	r := new(dns.Msg)
	r.SetReply(q)
	name := strings.ToLower(q.Question[0].Name)
	if strings.HasSuffix(name, ".blackhole.test.") {
		return // as from an upstream that is down
	}
	addr, ok := netZone[name]
	switch {
	case !ok:
		r.Rcode = dns.RcodeNameError
	case q.Question[0].Qtype == dns.TypeA:
		r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
			A: net.ParseIP(addr)})
	}
	w.WriteMsg(r)
}

// probe is run inside a sandbox by the host's python3: "dns NAME [SERVER]" asks the resolver
// that /etc/resolv.conf names (or SERVER) and prints the rcode and the A records, or the
// error's type when no answer comes ("timeout"); "get ADDR PORT" prints the
// body of an HTTP GET, or the error's type ("timeout" for a dropped connection); "links"
// prints the interfaces.
const probe = `
import socket, struct, sys
def dns(name, ns=None):
    ns = ns or [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
    q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)
    q += b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\0' + struct.pack('>HH', 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(q, (ns, 53))
        r = s.recv(1500)
    except socket.timeout:
        print('error=timeout')
        return
    except Exception as e:
        print('error=' + type(e).__name__)
        return
    i = 12
    while r[i]:
        i += r[i] + 1
    i += 5
    addrs = []
    for _ in range(struct.unpack('>H', r[6:8])[0]):
        if r[i] & 0xc0 == 0xc0:
            i += 2
        else:
            while r[i]:
                i += r[i] + 1
            i += 1
        t, c, ttl, l = struct.unpack('>HHIH', r[i:i+10])
        i += 10
        if t == 1:
            addrs.append(socket.inet_ntoa(r[i:i+4]))
        i += l
    print('rcode=%d addrs=%s' % (r[3] & 15, ','.join(addrs)))
def get(addr, port):
    try:
        c = socket.create_connection((addr, port), timeout=1.5)
        c.sendall(b'GET / HTTP/1.0\r\nHost: x\r\n\r\n')
        b = b''
        while True:
            d = c.recv(4096)
            if not d:
                break
            b += d
        print('body=' + b.split(b'\r\n\r\n', 1)[-1].decode())
    except socket.timeout:
        print('error=timeout')
    except Exception as e:
        print('error=' + type(e).__name__)
if sys.argv[1] == 'dns':
    dns(*sys.argv[2:4])
elif sys.argv[1] == 'get':
    get(sys.argv[2], int(sys.argv[3]))
else:
    print('links=' + ','.join(sorted(n for _, n in socket.if_nameindex())))
`

func (d *daemon) probe(id string, args ...string) string {
	d.t.Helper()
	r := d.exec(id, map[string]any{"command": append([]string{"/usr/bin/python3", "-c", probe}, args...), "timeout_ms": 20000})
	if r.ExitCode != 0 {
		d.t.Fatalf("probe %v in %s: exit %d: %s", args, id, r.ExitCode, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

func (d *daemon) reaches(id, addr string, port int) {
	d.t.Helper()
	want := fmt.Sprintf("body=hello from %s:%d", addr, port)
	if got := d.probe(id, "get", addr, strconv.Itoa(port)); got != want {
		d.t.Fatalf("GET %s:%d from %s = %q; want %q", addr, port, id, got, want)
	}
}

// dropped checks that a connection from the sandbox to addr:port is dropped: it times out,
// where a host that merely does not listen would refuse it at once.
func (d *daemon) dropped(id, addr string, port int) {
	d.t.Helper()
	if got := d.probe(id, "get", addr, strconv.Itoa(port)); got != "error=timeout" {
		d.t.Fatalf("GET %s:%d from %s = %q; want it dropped (error=timeout)", addr, port, id, got)
	}
}

func (d *daemon) resolves(id, name, want string) {
	d.t.Helper()
	if got := d.probe(id, "dns", name); got != "rcode=0 addrs="+want {
		d.t.Fatalf("resolve %s in %s = %q; want rcode=0 addrs=%s", name, id, got, want)
	}
}

func (d *daemon) refusedName(id, name string) {
	d.t.Helper()
	if got := d.probe(id, "dns", name); got != fmt.Sprintf("rcode=%d addrs=", dns.RcodeRefused) {
		d.t.Fatalf("resolve %s in %s = %q; want REFUSED (rcode=%d)", name, id, got, dns.RcodeRefused)
	}
}

type netSandboxJSON struct {
	ID      string          `json:"id"`
	State   string          `json:"state"`
	Address string          `json:"address"`
	Network *network.Policy `json:"network"`
}

func (d *daemon) createNet(id string, policy any) netSandboxJSON {
	d.t.Helper()
	body := map[string]any{"id": id, "start": true}
	if policy != nil {
		body["network"] = policy
	}
	sb := decode[netSandboxJSON](d.t, d.doJSON("POST", "/v1/sandboxes", body), 201)
	d.t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
	})
	return sb
}

// leftovers lists, with the package's own checker working in the host namespace, what the
// sandboxes of d that live does not name left behind.
func (w *netWorld) leftovers(t *testing.T, d *daemon, live ...string) network.Leftovers {
	t.Helper()
	m, err := network.New(network.Config{Dir: filepath.Join(d.Root, "network"), HostNS: w.host, Upstream: "127.0.0.1:53"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	l, err := m.Leftovers(func(id string) bool {
		for _, x := range live {
			if x == id {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (w *netWorld) noLeftovers(t *testing.T, d *daemon, live ...string) {
	t.Helper()
	if l := w.leftovers(t, d, live...); !l.Empty() {
		t.Fatalf("network leftovers (live: %v):\n%s", live, l.String())
	}
}

// apiPort is the port bothyd's API listens on.
func (d *daemon) apiPort() int {
	u, err := url.Parse(d.URL)
	if err != nil {
		d.t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

func TestNetworkPolicy(t *testing.T) {
	w := newNetWorld(t)
	top := startDaemon(t, w.daemon())

	d := top
	// By default a sandbox has no interface but lo, and shows no policy.
	plain := d.createNet("plain", nil)
	if plain.Network != nil || plain.Address != "" {
		t.Fatalf("a sandbox created without a policy shows %+v", plain)
	}
	if got := d.probe("plain", "links"); got != "links=lo" {
		t.Fatalf("a sandbox without a policy has %q; want links=lo", got)
	}

	// An invalid entry is refused, naming it.
	bad := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "bad", "network": map[string]any{"allow": []string{"allowed.test", "10.0.0.0/33"}}})
	if p := wantProblem(t, bad, 400, "invalid-request"); p.Field != "network.allow[1]" {
		t.Fatalf("an invalid allow entry is refused with field %q; want network.allow[1]", p.Field)
	}

	box := d.createNet("box", map[string]any{"allow": []string{"allowed.test", "192.0.2.0/24"}, "deny": []string{netDeniedHost}})
	if box.Network == nil || len(box.Network.Allow) != 2 || !netip.MustParseAddr(box.Address).IsValid() {
		t.Fatalf("a networked sandbox shows %+v; want its policy and address", box)
	}
	if got := d.probe("box", "links"); got != "links=eth0,lo" {
		t.Fatalf("a networked sandbox has %q; want links=eth0,lo", got)
	}
	t.Run("allow-list", func(t *testing.T) {
		d := d.in(t)
		d.resolves("box", "allowed.test", netAllowed)
		d.reaches("box", netAllowed, 80)
		d.refusedName("box", "other.test")
		d.dropped("box", netOther, 80)
		d.reaches("box", netCIDRHost, 80)
		d.dropped("box", netDeniedHost, 80) // deny wins over the allowed CIDR
	})
	// What went through the sandbox's interface shows in its usage, both ways; a sandbox
	// without a network has no such figure.
	if u := d.usage("box").Current; u.NetInBytes == nil || u.NetOutBytes == nil || *u.NetInBytes <= 0 || *u.NetOutBytes <= 0 {
		t.Errorf("the networked sandbox's usage shows network bytes in %v, out %v; want both above 0", u.NetInBytes, u.NetOutBytes)
	}
	if u := d.usage("plain").Current; u.NetInBytes != nil || u.NetOutBytes != nil {
		t.Errorf("a sandbox without a network shows network bytes in %v, out %v", u.NetInBytes, u.NetOutBytes)
	}

	open := d.createNet("open", map[string]any{"internet": true})
	t.Run("always-denied", func(t *testing.T) {
		d := d.in(t)
		d.reaches("open", netOther, 80)
		gw := netip.MustParseAddr(open.Address).Prev().String()
		for _, id := range []string{"open", "box"} {
			d.dropped(id, netMetadata, 80)
			d.dropped(id, netHostUplink.Addr().String(), netHostPort) // the host's own service
			d.dropped(id, gw, d.apiPort())                            // bothyd's API, at the gateway
			// The sandbox's loopback is its own: nothing listens there, bothyd's API least of all.
			if got := d.probe(id, "get", "127.0.0.1", strconv.Itoa(d.apiPort())); got != "error=ConnectionRefusedError" {
				t.Fatalf("GET 127.0.0.1:%d from %s = %q; want it refused by the sandbox's own loopback", d.apiPort(), id, got)
			}
		}
		d.dropped("open", box.Address, 80) // another sandbox
		d.dropped("box", open.Address, 80)
	})

	t.Run("live-update", func(t *testing.T) {
		d := d.in(t)
		sb := decode[netSandboxJSON](t, d.doJSON("PUT", "/v1/sandboxes/box/network", map[string]any{"allow": []string{"other.test"}}), 200)
		if sb.Network == nil || len(sb.Network.Allow) != 1 || sb.Network.Allow[0] != "other.test" || sb.Address != box.Address {
			t.Fatalf("after the update the sandbox shows %+v", sb)
		}
		d.resolves("box", "other.test", netOther)
		d.reaches("box", netOther, 80)
		d.refusedName("box", "allowed.test")
		d.dropped("box", netAllowed, 80) // its pin went with the name
		bad := d.doJSON("PUT", "/v1/sandboxes/box/network", map[string]any{"deny": []string{"*.*.bad"}})
		if p := wantProblem(t, bad, 400, "invalid-request"); p.Field != "network.deny[0]" {
			t.Fatalf("an invalid deny entry is refused with field %q; want network.deny[0]", p.Field)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		d := d.in(t)
		r := d.do("GET", "/metrics", nil, nil)
		for _, kind := range []string{"policy", "always-denied", "dns-refused", "host"} {
			m := regexp.MustCompile(`bothy_network_denied_total\{kind="` + kind + `"\} (\d+)`).FindSubmatch(r.Body)
			if m == nil || string(m[1]) == "0" {
				t.Errorf("bothy_network_denied_total{kind=%q} = %s; want it counted", kind, m)
			}
		}
	})

	t.Run("kill-and-restart", func(t *testing.T) {
		// A SIGKILLed bothyd leaves the running sandboxes' networks, whose resolvers died
		// with it; the restarted one re-arms them, and keeps their policy.
		top.Restart(true)
		d := top.in(t)
		d.resolves("box", "other.test", netOther)
		d.refusedName("box", "allowed.test")
		d.reaches("open", netOther, 80)
		w.noLeftovers(t, d, "box", "open")
	})

	t.Run("stop-and-delete", func(t *testing.T) {
		d := d.in(t)
		decode[netSandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/open/stop", nil), 200)
		w.noLeftovers(t, d, "box")
		if l := w.leftovers(t, d); len(l.Records) != 1 || l.Records[0] != "box" {
			t.Fatalf("with box running, its record is missing: %+v", l)
		}
		decode[netSandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/box/stop?force=true", nil), 200)
		if r := d.doJSON("DELETE", "/v1/sandboxes/box", nil); r.Status != 204 {
			t.Fatalf("delete: %d %s", r.Status, r.Body)
		}
		w.noLeftovers(t, d)
	})

	t.Run("killed-bothyd-then-stopped", func(t *testing.T) {
		// A sandbox that ends while bothyd is down leaves its network to the restarted
		// bothyd's reattach, which tears it down.
		d := d.in(t)
		decode[netSandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/open/start", nil), 200)
		top.Kill()
		for _, p := range listProcesses(t, d.Root) {
			if p.Dir == filepath.Join(d.Root, "sandboxes", "open") && p.Role == "init" {
				if err := platform.SignalVerified(p.ID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
		}
		waitFor(t, 10*time.Second, "the sandbox's runtime process to end", func() bool {
			for _, p := range listProcesses(t, d.Root) {
				if p.Dir == filepath.Join(d.Root, "sandboxes", "open") {
					return false
				}
			}
			return true
		})
		top.start()
		// bothyd serves while its start-up pass reattaches, and the pass tears the ended
		// sandbox's network down: wait for that, then nothing may be left.
		waitFor(t, 30*time.Second, "the restarted bothyd to tear down the ended sandbox's network", func() bool {
			return w.leftovers(t, top).Empty()
		})
		w.noLeftovers(t, top.in(t))
	})

	t.Run("figures", func(t *testing.T) {
		d := d.in(t)
		timeStart := func(id string, policy any) time.Duration {
			begin := time.Now()
			d.createNet(id, policy)
			return time.Since(begin)
		}
		var with, without time.Duration
		const n = 3
		for i := range n {
			without += timeStart(fmt.Sprintf("fig-plain-%d", i), nil)
			with += timeStart(fmt.Sprintf("fig-net-%d", i), map[string]any{"internet": true})
		}
		t.Logf("create+start, mean of %d: without network %v, with network %v", n, without/n, with/n)
	})
}
