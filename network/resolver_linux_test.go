//go:build linux

package network

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/bothy/bothy/internal/ratelog"
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

// The flood's child process: BOTHY_TEST_FLOOD names the resolver to flood, and the child,
// started inside the flooding sandbox's namespace, opens TCP connections to it and sends
// queries for names the upstream never answers, again and again, until its stdin closes. It
// prints "ready" after its first round.
const floodEnv = "BOTHY_TEST_FLOOD"

func TestMain(m *testing.M) {
	if at := os.Getenv(floodEnv); at != "" {
		flood(at)
		return
	}
	os.Exit(m.Run())
}

func flood(at string) {
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	udp, err := net.Dial("udp4", at)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	var conns []net.Conn
	for round := 0; ; round++ {
		for i := range 1000 {
			c, err := net.DialTimeout("tcp4", at, time.Second)
			if err != nil {
				continue
			}
			conns = append(conns, c)
			q := new(dns.Msg)
			q.SetQuestion(fmt.Sprintf("t%d-%d.blackhole.test.", round, i), dns.TypeA)
			_ = (&dns.Conn{Conn: c}).WriteMsg(q)
		}
		for i := range 2000 {
			q := new(dns.Msg)
			q.SetQuestion(fmt.Sprintf("u%d-%d.blackhole.test.", round, i), dns.TypeA)
			_ = (&dns.Conn{Conn: udp}).WriteMsg(q)
		}
		if round == 0 {
			fmt.Println("ready")
		}
		// Keep the sockets of this round, and drop those of the one before: the flood holds
		// about two rounds' worth of connections at a time, whatever the resolver closed.
		if len(conns) > 2000 {
			for _, c := range conns[:len(conns)-1000] {
				c.Close()
			}
			conns = slices.Clone(conns[len(conns)-1000:])
		}
		select {
		case <-stop:
			return
		default:
		}
	}
}

// startIn starts cmd inside the network namespace ns: the child inherits the namespace of the
// thread that forks it, and that thread is never returned to the pool.
func startIn(ns *os.File, cmd *exec.Cmd) error {
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

func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(entries)
}

// syncBuffer is a log sink the test reads while the Manager writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) lines(substr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), substr)
}

// TestResolverFloodIsBounded: issue 37 item 4. Root in one sandbox opens thousands of TCP
// connections to its resolver and sends thousands of queries the upstream never answers,
// without end. The process that runs the resolvers (this test's, which runs no other
// sockets meanwhile: the flood is a child process) holds at most the sandbox's bounds of
// connections and pending queries, and a few more descriptors; another sandbox's resolver
// answers throughout; and the flood's log lines are a handful.
func TestResolverFloodIsBounded(t *testing.T) {
	w := newWorld(t)
	var logs syncBuffer
	w.m.log = slog.New(slog.NewJSONHandler(&logs, nil))
	w.m.rl = ratelog.NewKeyed(w.m.log, logEvery, maxLogKeys)
	fl := w.sandbox(t, "flood", Policy{Internet: true})
	calm := w.sandbox(t, "calm", Policy{Allow: []string{"allowed.test"}})
	calm.resolves("allowed.test", allowedHost.String())

	before := openFDs(t)
	// What the sandbox can make the resolver hold: its connections and its pending queries
	// (a socket each), plus a little for what the test and the Manager open meanwhile (the
	// other sandbox's queries at both ends, a namespace handle while a query goes upstream).
	bound := before + maxConnsPerSandbox + maxPendingPerSandbox + 16

	exe, err := os.Executable()
	must(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), floodEnv+"="+netip.AddrPortFrom(fl.att.Gateway, 53).String())
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, startIn(fl.ns, cmd))
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("the flood's child said %q, %v", line, err)
	}

	// While the flood goes on, for twice the upstream timeout (so that queries forwarded at
	// its start have timed out and been replaced): the descriptors stay within the bound,
	// and the other sandbox's resolver answers, over UDP and TCP.
	most := 0
	for end := time.Now().Add(2 * upstreamTimeout); time.Now().Before(end); {
		most = max(most, openFDs(t))
		calm.resolves("allowed.test", allowedHost.String())
		if rcode, err := calm.ask(calm.att.Gateway, "tcp", "allowed.test.", 5*time.Second); err != nil || rcode != dns.RcodeSuccess {
			t.Fatalf("calm's resolver over TCP during the flood: %s, %v", dns.RcodeToString[rcode], err)
		}
	}
	t.Logf("open descriptors: %d before the flood, at most %d during it (bound %d)", before, most, bound)
	if most > bound {
		t.Errorf("the resolvers' process held %d descriptors during the flood; want at most %d", most, bound)
	}
	w.m.mu.Lock()
	sb := w.m.sandboxes["flood"]
	w.m.mu.Unlock()
	if n := sb.conns.n.Load(); n > maxConnsPerSandbox {
		t.Errorf("%d connections admitted; want at most %d", n, maxConnsPerSandbox)
	}
	// One line per kind and logEvery: at most three kinds (connections closed at the bound,
	// queries not forwarded, the upstream's failures), in two periods of the flood.
	if n := logs.lines(`"sandbox":"flood"`); n > 6 {
		t.Errorf("the flood caused %d log lines; want at most 6:\n%s", n, logs.buf.String())
	}
	if n := logs.lines(`"suppressed"`) + logs.lines(`at its bound`); n == 0 {
		t.Errorf("no log line says the flood was bounded:\n%s", logs.buf.String())
	}
}

// TestPinsAreBounded: a zone the policy allows can answer as many distinct addresses as its
// owner likes, each pinned (a kernel set element) for up to a day. Past the sandbox's bound of
// pinned addresses an answer with a new one is SERVFAIL, unpinned; addresses already pinned
// are answered still.
func TestPinsAreBounded(t *testing.T) {
	w := newWorld(t)
	l := defaultLimits
	l.pinsPerSandbox = 3
	w.m.setLimits(l)
	s := w.sandbox(t, "box", Policy{Allow: []string{"*.test"}})
	s.resolves("allowed.test", allowedHost.String())
	s.resolves("other.test", otherHost.String())
	s.resolves("private.test", privateHost.String())
	if rcode, addrs := s.resolve("cidr.test"); rcode != dns.RcodeServerFailure || len(addrs) != 0 {
		t.Fatalf("a fourth address past a bound of 3 = %s %v; want SERVFAIL", dns.RcodeToString[rcode], addrs)
	}
	s.resolves("sub.wild.test", allowedHost.String()) // pinned already
	s.unreachable(cidrHost.String(), 80)              // not pinned
	s.reachable(allowedHost.String(), 80)
}

// TestStopResolverBeforeItStarted: a resolver stopped before its goroutine activated it
// (a teardown or Close right after the setup) has its sockets closed, and its server, when
// the goroutine gets to it, ends at once rather than serving for the rest of the process.
// Without the close, Shutdown's "server not started" left both sockets open.
func TestStopResolverBeforeItStarted(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	must(t, err)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	must(t, err)
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {})
	sb := &sandbox{id: "early", servers: []*dns.Server{{PacketConn: pc, Handler: handler}, {Listener: ln, Handler: handler}}}
	servers := sb.servers
	must(t, pc.SetReadDeadline(time.Now().Add(time.Second)))
	sb.stopResolver()
	if sb.servers != nil || !sb.stopped.Load() {
		t.Fatalf("after stopResolver: servers %v, stopped %v", sb.servers, sb.stopped.Load())
	}
	if _, _, err := pc.ReadFrom(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the UDP socket after stopResolver: %v, want it closed", err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the TCP listener after stopResolver: %v, want it closed", err)
	}
	for _, s := range servers {
		done := make(chan error, 1)
		go func() { done <- s.ActivateAndServe() }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("a server activated after its stop served and returned no error")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a server activated after its stop is serving")
		}
	}
}
