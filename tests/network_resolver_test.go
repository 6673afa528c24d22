package tests

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestNetworkResolvers: issue 37's resolver items end to end, on the real bothyd in the test's
// own network namespaces (as TestNetworkPolicy). Item 1: a sandbox reaches its own resolver and
// no other, whatever the others' policies. Item 4: one sandbox's flood of DNS-over-TCP
// connections and unanswerable queries leaves /healthz and another sandbox's resolver
// answering, bothyd's open descriptors within a stated bound, and its log quiet.
func TestNetworkResolvers(t *testing.T) {
	w := newNetWorld(t)
	d := startDaemon(t, w.daemon())
	narrow := d.createNet("narrow", map[string]any{"allow": []string{"allowed.test"}})
	open := d.createNet("open", map[string]any{"internet": true})
	gateway := func(sb netSandboxJSON) netip.Addr { return netip.MustParseAddr(sb.Address).Prev() }

	t.Run("own-resolver-only", func(t *testing.T) {
		d := d.in(t)
		d.resolves("open", "other.test", netOther)
		d.resolves("narrow", "allowed.test", netAllowed)
		d.refusedName("narrow", "other.test")
		// The same query, to the other sandbox's gateway: no answer at all.
		if got := d.probe("narrow", "dns", "other.test", gateway(open).String()); got != "error=timeout" {
			t.Fatalf("narrow's query to open's resolver (%s) = %q; want no answer (error=timeout)", gateway(open), got)
		}
		if got := d.probe("open", "dns", "allowed.test", gateway(narrow).String()); got != "error=timeout" {
			t.Fatalf("open's query to narrow's resolver (%s) = %q; want no answer (error=timeout)", gateway(narrow), got)
		}
	})

	t.Run("flood", func(t *testing.T) {
		d := d.in(t)
		ns := sandboxNetNS(t, d, "open")
		pid := d.cmd.Process.Pid
		before := openFDsOf(t, pid)
		// The flooding sandbox's share (16 connections, 32 pending queries), and room for
		// what the test itself makes bothyd hold meanwhile: its API connections, an exec's
		// pipes and control stream, the other sandbox's queries.
		bound := before + 16 + 32 + 32
		logsBefore := len(floodLines(d))

		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = runInNS(ns, func() error { dnsFlood(netip.AddrPortFrom(gateway(open), 53).String(), stop); return nil })
		}()
		t.Cleanup(func() { close(stop); wg.Wait() })

		// For twice the upstream's timeout of 5 s, so that queries forwarded at the start
		// have timed out and been replaced: /healthz and the other sandbox's resolver answer
		// (its probe resolves over UDP; the test's query over TCP from its namespace), and
		// bothyd's descriptors stay within the bound.
		narrowNS := sandboxNetNS(t, d, "narrow")
		most := 0
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
			most = max(most, openFDsOf(t, pid))
			resp, err := d.httpClient().Get(d.URL + "/healthz")
			if err != nil {
				t.Fatalf("/healthz during the flood: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("/healthz during the flood: %s", resp.Status)
			}
			d.resolves("narrow", "allowed.test", netAllowed)
			if err := askTCP(narrowNS, gateway(narrow), "allowed.test."); err != nil {
				t.Fatalf("narrow's resolver over TCP during the flood: %v", err)
			}
			most = max(most, openFDsOf(t, pid))
		}
		t.Logf("bothyd's open descriptors: %d before the flood, at most %d during it (bound %d)", before, most, bound)
		if most > bound {
			t.Errorf("bothyd held %d descriptors during the flood; want at most %d", most, bound)
		}
		// One line per kind of resolver line and 10 s, in a flood of about 10 s: connections
		// closed at the bound, queries not forwarded, the upstream's failures.
		if lines := floodLines(d)[logsBefore:]; len(lines) > 6 {
			t.Errorf("the flood caused %d log lines; want at most 6:\n%s", len(lines), strings.Join(lines, "\n"))
		}
	})
}

// sandboxNetNS opens the network namespace of sandbox id's init.
func sandboxNetNS(t *testing.T, d *daemon, id string) *os.File {
	t.Helper()
	for _, p := range listProcesses(t, d.Root) {
		if p.Role == "init" && filepath.Base(p.Dir) == id {
			f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", p.ID.Pid))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}
	}
	t.Fatalf("no init of %s", id)
	return nil
}

func openFDsOf(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// floodLines are bothyd's log lines about the flooding sandbox's resolver.
func floodLines(d *daemon) []string {
	var out []string
	for _, l := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(l, `"sandbox":"open"`) && strings.Contains(l, `"msg":"network: `) &&
			!strings.Contains(l, "sandbox attached") {
			out = append(out, l)
		}
	}
	return out
}

// askTCP asks server over TCP, from inside ns, for name's A records, and fails unless it
// answers NOERROR.
func askTCP(ns *os.File, server netip.Addr, name string) error {
	return runInNS(ns, func() error {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		r, _, err := (&dns.Client{Net: "tcp", Timeout: 5 * time.Second}).Exchange(q, netip.AddrPortFrom(server, 53).String())
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
		}
		return nil
	})
}

// dnsFlood is a sandbox's root at its worst: round after round, until stop, 1000 TCP
// connections to the resolver at, each sending a query the upstream never answers and held
// open, and 2000 such queries over UDP. It keeps the last round's connections and closes the
// older ones.
func dnsFlood(at string, stop <-chan struct{}) {
	udp, err := net.Dial("udp4", at)
	if err != nil {
		return
	}
	defer udp.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
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
		if len(conns) > 2000 {
			for _, c := range conns[:len(conns)-1000] {
				c.Close()
			}
			conns = append([]net.Conn(nil), conns[len(conns)-1000:]...)
		}
		select {
		case <-stop:
			return
		default:
		}
	}
}
