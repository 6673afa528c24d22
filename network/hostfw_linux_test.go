//go:build linux

package network

import (
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// Firewalls as Docker and ufw leave them, made with their own tool (iptables) in the test's
// host namespace: Docker's FORWARD policy DROP with its DOCKER-USER, DOCKER-FORWARD and
// isolation chains (as Docker 28 makes them), and ufw's DROP policies for FORWARD and INPUT
// with the jumps to its chains.
var (
	dockerRules = [][]string{
		{"-P", "FORWARD", "DROP"},
		{"-N", "DOCKER-USER"},
		{"-N", "DOCKER-FORWARD"},
		{"-N", "DOCKER-ISOLATION-STAGE-1"},
		{"-N", "DOCKER-ISOLATION-STAGE-2"},
		{"-N", "DOCKER-CT"},
		{"-A", "FORWARD", "-j", "DOCKER-USER"},
		{"-A", "FORWARD", "-j", "DOCKER-FORWARD"},
		{"-A", "DOCKER-USER", "-j", "RETURN"},
		{"-A", "DOCKER-FORWARD", "-j", "DOCKER-CT"},
		{"-A", "DOCKER-FORWARD", "-j", "DOCKER-ISOLATION-STAGE-1"},
		{"-A", "DOCKER-FORWARD", "-i", "docker0", "-j", "ACCEPT"},
		{"-A", "DOCKER-CT", "-o", "docker0", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
		{"-A", "DOCKER-ISOLATION-STAGE-1", "-i", "docker0", "!", "-o", "docker0", "-j", "DOCKER-ISOLATION-STAGE-2"},
		{"-A", "DOCKER-ISOLATION-STAGE-2", "-o", "docker0", "-j", "DROP"},
		{"-t", "nat", "-N", "DOCKER"},
		{"-t", "nat", "-A", "POSTROUTING", "-s", "172.17.0.0/16", "!", "-o", "docker0", "-j", "MASQUERADE"},
	}
	ufwRules = [][]string{
		{"-P", "INPUT", "DROP"},
		{"-P", "FORWARD", "DROP"},
		{"-N", "ufw-before-input"},
		{"-N", "ufw-before-forward"},
		{"-N", "ufw-user-forward"},
		{"-A", "INPUT", "-j", "ufw-before-input"},
		{"-A", "FORWARD", "-j", "ufw-before-forward"},
		{"-A", "ufw-before-input", "-i", "lo", "-j", "ACCEPT"},
		{"-A", "ufw-before-input", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
		{"-A", "ufw-before-forward", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
		{"-A", "ufw-before-forward", "-j", "ufw-user-forward"},
	}
)

// xt runs an iptables command in the world's host namespace.
func (w *world) xt(t *testing.T, cmd string, args ...string) string {
	t.Helper()
	var out []byte
	err := inNS(t, w.host, func() (err error) {
		out, err = exec.Command(cmd, append([]string{"-w"}, args...)...).CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("%s %v: %v: %s", cmd, args, err, out)
	}
	return string(out)
}

// bothyRules lists bothyd's rules in the host namespace's filter table, as `iptables -S`
// shows them.
func (w *world) bothyRules(t *testing.T, cmd string) []string {
	t.Helper()
	var rules []string
	for _, l := range strings.Split(w.xt(t, cmd, "-S"), "\n") {
		if strings.Contains(l, "--comment bothy-") {
			rules = append(rules, l)
		}
	}
	return rules
}

// dropBothyRules removes bothyd's rules by hand, as if bothyd had never added them.
func (w *world) dropBothyRules(t *testing.T, cmd string) {
	t.Helper()
	for _, l := range w.bothyRules(t, cmd) {
		w.xt(t, cmd, append([]string{"-D"}, strings.Fields(strings.TrimPrefix(l, "-A "))...)...)
	}
}

func needCommand(t *testing.T, cmd string) {
	t.Helper()
	if _, err := exec.LookPath(cmd); err != nil {
		t.Skipf("%s is not installed (scripts/setup installs Debian's iptables): %v", cmd, err)
	}
}

// TestBesideHostFirewall shows that a sandbox's allowed destinations are reached beside
// Docker's and ufw's rules (which without bothyd's rules drop them), that what its policy does
// not allow is still dropped, that the rules are there once however often they are looked at,
// also by a new Manager (bothyd restarted after a SIGKILL), and that a firewall bothyd cannot
// open is reported blocked.
func TestBesideHostFirewall(t *testing.T) {
	for _, tc := range []struct {
		name, cmd string
		rules     [][]string
		want      map[string]int // bothyd's rules per chain
		blocked   string         // the state when the command is gone
	}{
		{"docker", "iptables-nft", dockerRules, map[string]int{"DOCKER-USER": 2}, FirewallBlocked},
		{"ufw", "iptables-nft", ufwRules, map[string]int{"FORWARD": 2, "INPUT": 2}, FirewallBlocked},
		{"docker-legacy", "iptables-legacy", dockerRules, map[string]int{"DOCKER-USER": 2}, FirewallUnknown},
		{"ufw-legacy", "iptables-legacy", ufwRules, map[string]int{"FORWARD": 2, "INPUT": 2}, FirewallUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			needCommand(t, tc.cmd)
			w := newWorld(t)
			for _, r := range tc.rules {
				w.xt(t, tc.cmd, r...)
			}
			s := w.sandbox(t, "box", Policy{Allow: []string{"allowed.test"}})
			if fw := w.m.HostFirewall(); fw.State != FirewallOK {
				t.Fatalf("after Setup the host's firewall is %+v; want ok", fw)
			}
			s.resolves("allowed.test", allowedHost.String())
			s.reachable(allowedHost.String(), 80)
			s.unreachable(otherHost.String(), 80) // outside the policy: bothyd's table drops it
			inboundDropped(t, w, s)

			perChain := func() map[string]int {
				n := map[string]int{}
				for _, l := range w.bothyRules(t, tc.cmd) {
					n[strings.Fields(l)[1]]++
				}
				return n
			}
			if got := perChain(); !mapsEqual(got, tc.want) {
				t.Fatalf("bothyd's rules per chain: %v; want %v", got, tc.want)
			}

			// Without bothyd's rules, the firewall drops the allowed host: the regression.
			w.dropBothyRules(t, tc.cmd)
			s.unreachable(allowedHost.String(), 80)

			// A new Manager, as after bothyd's SIGKILL and restart, puts them back once, and
			// looking again adds nothing.
			m2, err := New(Config{Dir: w.dir, HostNS: w.host, Upstream: w.m.cfg.Upstream, Uplink: "up0", Log: quiet})
			must(t, err)
			defer m2.Close()
			for range 3 {
				if fw := m2.OpenHostFirewall(); fw.State != FirewallOK {
					t.Fatalf("OpenHostFirewall = %+v; want ok", fw)
				}
			}
			begin := time.Now()
			w.m.OpenHostFirewall()
			t.Logf("a look at a firewall already opened takes %v", time.Since(begin))
			if got := perChain(); !mapsEqual(got, tc.want) {
				t.Fatalf("after a restart and repeated looks, bothyd's rules per chain: %v; want %v", got, tc.want)
			}
			s.reachable(allowedHost.String(), 80)
			s.unreachable(otherHost.String(), 80)

			// A copy (two processes' inserts, say) goes at the next look.
			first := strings.Fields(strings.TrimPrefix(w.bothyRules(t, tc.cmd)[0], "-A "))
			w.xt(t, tc.cmd, append([]string{"-I"}, first...)...)
			m2.OpenHostFirewall()
			if got := perChain(); !mapsEqual(got, tc.want) {
				t.Fatalf("after a copy and a look, bothyd's rules per chain: %v; want %v", got, tc.want)
			}

			// Without the command, the firewall cannot be opened, and that is said.
			w.dropBothyRules(t, tc.cmd)
			t.Setenv("PATH", t.TempDir())
			fw := m2.OpenHostFirewall()
			if fw.State != tc.blocked || !strings.Contains(fw.Detail, "install iptables") {
				t.Fatalf("without iptables, OpenHostFirewall = %+v; want %s, saying to install iptables", fw, tc.blocked)
			}
			s.unreachable(allowedHost.String(), 80)
		})
	}
}

// inboundDropped checks that bothyd's rules let nothing into a sandbox that it did not open:
// the internet, given a route to the pool, cannot reach a service the sandbox listens on.
func inboundDropped(t *testing.T, w *world, s *testSandbox) {
	t.Helper()
	ih := handleIn(t, w.inet)
	up1, err := ih.LinkByName("up1")
	must(t, err)
	route := &netlink.Route{LinkIndex: up1.Attrs().Index, Dst: ipnet(DefaultPool.Addr(), DefaultPool.Bits()), Gw: hostUplink.Addr().AsSlice()}
	must(t, ih.RouteReplace(route))
	serveHTTP(t, s.ns, ":8081")
	err = inNS(t, w.inet, func() error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(s.att.Address, 8081).String(), 700*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Fatal("the internet opened a connection to a sandbox's service; want it dropped")
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestHostFirewallFindings shows what is said of filters bothyd does not open, and that a
// host without any changes nothing.
func TestHostFirewallFindings(t *testing.T) {
	w := newWorld(t)
	begin := time.Now()
	if fw := w.m.OpenHostFirewall(); fw.State != FirewallOK {
		t.Fatalf("with no other filter, OpenHostFirewall = %+v; want ok", fw)
	}
	t.Logf("a look with no other filter takes %v", time.Since(begin))
	c, err := nftables.New(nftables.WithNetNSFd(int(w.host.Fd())))
	must(t, err)
	tables, err := c.ListTables()
	must(t, err)
	if len(tables) != 0 {
		t.Fatalf("with no other filter, the namespace has tables %v after a look; want none", tables)
	}

	drop, accept := nftables.ChainPolicyDrop, nftables.ChainPolicyAccept
	other := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "other"})
	c.AddChain(&nftables.Chain{Name: "fwd", Table: other, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	must(t, c.Flush())
	fw := w.m.OpenHostFirewall()
	if fw.State != FirewallBlocked || !strings.Contains(fw.Detail, "chain fwd of table ip other") {
		t.Fatalf("beside a foreign chain that drops, OpenHostFirewall = %+v; want blocked, naming it", fw)
	}
	c.DelTable(other)
	firewalld := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "firewalld"})
	c.AddChain(&nftables.Chain{Name: "filter_FORWARD", Table: firewalld, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	must(t, c.Flush())
	t.Setenv("PATH", t.TempDir()) // no firewall-cmd (TestBesideFirewalld runs it)
	fw = w.m.OpenHostFirewall()
	if fw.State != FirewallUnknown || !strings.Contains(fw.Detail, "firewalld") {
		t.Fatalf("beside firewalld, OpenHostFirewall = %+v; want unknown, naming firewalld", fw)
	}
	c.DelTable(firewalld)
	must(t, c.Flush())
	if fw := w.m.OpenHostFirewall(); fw.State != FirewallOK {
		t.Fatalf("once the foreign tables are gone, OpenHostFirewall = %+v; want ok", fw)
	}
	tables, err = c.ListTables()
	must(t, err)
	if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == "filter" }) {
		t.Fatal("a look made iptables' filter table where there was none")
	}
}

// TestDockerStartedAfter shows that rules put at the top of FORWARD move to DOCKER-USER once
// Docker has made it (Docker started after bothyd), and that the sandbox keeps its way out.
func TestDockerStartedAfter(t *testing.T) {
	needCommand(t, "iptables-nft")
	w := newWorld(t)
	w.xt(t, "iptables-nft", "-P", "FORWARD", "DROP")
	s := w.sandbox(t, "box", Policy{Allow: []string{"allowed.test"}})
	s.resolves("allowed.test", allowedHost.String())
	chains := func() []string {
		var out []string
		for _, l := range w.bothyRules(t, "iptables-nft") {
			out = append(out, strings.Fields(l)[1])
		}
		return out
	}
	if got := chains(); !slices.Equal(got, []string{"FORWARD", "FORWARD"}) {
		t.Fatalf("before Docker, bothyd's rules are in %v; want FORWARD's top", got)
	}
	for _, r := range dockerRules[1:] {
		w.xt(t, "iptables-nft", r...)
	}
	w.xt(t, "iptables-nft", "-I", "FORWARD", "-j", "DOCKER-USER") // Docker puts its jump first
	if fw := w.m.OpenHostFirewall(); fw.State != FirewallOK || !strings.Contains(fw.Detail, "DOCKER-USER") {
		t.Fatalf("after Docker, OpenHostFirewall = %+v; want ok, at DOCKER-USER", fw)
	}
	if got := chains(); !slices.Equal(got, []string{"DOCKER-USER", "DOCKER-USER"}) {
		t.Fatalf("after Docker, bothyd's rules are in %v; want DOCKER-USER alone", got)
	}
	s.reachable(allowedHost.String(), 80)
	s.unreachable(otherHost.String(), 80)
}

// startFirewalld runs firewalld in the world's host namespace, on a D-Bus system bus of the
// test's own (DBUS_SYSTEM_BUS_ADDRESS, which firewall-cmd, the Manager's included, follows),
// and waits until it answers.
func startFirewalld(t *testing.T, w *world) {
	t.Helper()
	for _, cmd := range []string{"firewalld", "firewall-cmd", "dbus-daemon"} {
		needCommand(t, cmd)
	}
	dir := t.TempDir()
	bus := "unix:path=" + filepath.Join(dir, "bus")
	daemon := func(name string, args ...string) {
		cmd := exec.Command(name, args...)
		must(t, inNS(t, w.host, cmd.Start))
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	daemon("dbus-daemon", "--system", "--nofork", "--nopidfile", "--address="+bus)
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", bus)
	daemon("firewalld", "--nofork", "--nopid")
	deadline := time.Now().Add(120 * time.Second) // python, and its ruleset, on shared cores
	for exec.Command("firewall-cmd", "--state").Run() != nil {
		if time.Now().After(deadline) {
			t.Fatal("firewalld did not answer within 120 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func firewallCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("firewall-cmd", args...).CombinedOutput(); err != nil {
		t.Fatalf("firewall-cmd %v: %v: %s", args, err, out)
	}
}

// TestBesideFirewalld shows that firewalld's default rules (forwarded traffic from an
// interface of no zone is rejected) drop a sandbox's allowed host, that bothy's interfaces in
// its trusted zone let it through and no more, and that their removal (a reload of
// firewalld's) is repaired at the next look. firewalld runs in the test's namespace.
func TestBesideFirewalld(t *testing.T) {
	w := newWorld(t)
	begin := time.Now()
	startFirewalld(t, w)
	t.Logf("firewalld answered after %v", time.Since(begin))
	begin = time.Now()
	s := w.sandbox(t, "box", Policy{Allow: []string{"allowed.test"}})
	t.Logf("Setup took %v", time.Since(begin))
	if fw := w.m.HostFirewall(); fw.State != FirewallOK || !strings.Contains(fw.Detail, "zone trusted") {
		t.Fatalf("after Setup beside firewalld, HostFirewall = %+v; want ok, in zone trusted", fw)
	}
	s.resolves("allowed.test", allowedHost.String())
	s.reachable(allowedHost.String(), 80)
	s.unreachable(otherHost.String(), 80)
	inboundDropped(t, w, s)

	// Without bothy's interfaces in a zone (as a reload of firewalld leaves them, its runtime
	// configuration gone), firewalld rejects the allowed host: the regression. The next look
	// puts them back.
	firewallCmd(t, "--zone=trusted", "--remove-interface=sbxd+")
	s.unreachable(allowedHost.String(), 80)
	if fw := w.m.OpenHostFirewall(); fw.State != FirewallOK {
		t.Fatalf("after the interfaces left the zone, OpenHostFirewall = %+v; want ok", fw)
	}
	s.reachable(allowedHost.String(), 80)
	s.unreachable(otherHost.String(), 80)

	// Interfaces someone put in another zone stay there, and that is said.
	firewallCmd(t, "--zone=trusted", "--remove-interface=sbxd+")
	firewallCmd(t, "--zone=public", "--add-interface=sbxd+")
	if fw := w.m.OpenHostFirewall(); fw.State != FirewallUnknown || !strings.Contains(fw.Detail, "zone public") {
		t.Fatalf("with bothy's interfaces in zone public, OpenHostFirewall = %+v; want unknown, naming the zone", fw)
	}
	firewallCmd(t, "--zone=public", "--remove-interface=sbxd+")

	// Without firewall-cmd, the zone cannot be chosen, and that is said.
	t.Setenv("PATH", t.TempDir())
	if fw := w.m.OpenHostFirewall(); fw.State != FirewallUnknown || !strings.Contains(fw.Detail, "firewall-cmd") {
		t.Fatalf("without firewall-cmd, OpenHostFirewall = %+v; want unknown, naming firewall-cmd", fw)
	}
	s.unreachable(allowedHost.String(), 80)
}
