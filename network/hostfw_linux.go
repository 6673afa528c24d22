//go:build linux

package network

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// The host's own firewall.
//
// In netfilter a packet accepted by one base chain still traverses every other base chain of
// the same hook, and a drop anywhere is final: bothyd's own table, whose base chains accept
// by policy and only ever drop, cannot make a foreign filter let the sandboxes' traffic
// through. Docker sets iptables' FORWARD policy to DROP, ufw does too (and its INPUT policy),
// so on such a host the sandboxes' forwarded traffic, and their queries to the resolver on
// their gateway, die in iptables' filter table before bothyd's policy matters. bothyd adds
// accept rules for exactly its own interfaces there, each tagged with a comment: they open
// nothing more, because bothyd's own chains still drop, at the same hook, whatever the
// sandbox's policy does not allow, and everything into a sandbox that it did not open.

// The rules bothyd adds to iptables' filter table. The comments make them recognisable, and
// are what [Manager.OpenHostFirewall] counts to keep exactly one of each.
var (
	fwForward = [][]string{
		{"-i", ifPrefix + "+", "-m", "comment", "--comment", "bothy-sandboxes-out", "-j", "ACCEPT"},
		{"-o", ifPrefix + "+", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
			"-m", "comment", "--comment", "bothy-sandboxes-replies", "-j", "ACCEPT"},
	}
	// The sandboxes' resolvers listen on port 53 of their gateways; bothyd's input chain
	// drops everything else from a sandbox, whatever these accept.
	fwInput = [][]string{
		{"-i", ifPrefix + "+", "-p", "udp", "--dport", "53", "-m", "comment", "--comment", "bothy-sandboxes-dns-udp", "-j", "ACCEPT"},
		{"-i", ifPrefix + "+", "-p", "tcp", "--dport", "53", "-m", "comment", "--comment", "bothy-sandboxes-dns-tcp", "-j", "ACCEPT"},
	}
)

// dockerUserChain is where Docker documents that users' rules go: it is jumped to first from
// FORWARD, and Docker keeps it, and what it holds, across its restarts.
const dockerUserChain = "DOCKER-USER"

// xtablesWait bounds, in seconds, how long an iptables command waits for the xtables lock
// another program holds: a look runs under the Manager's lock, in a sandbox's setup.
const xtablesWait = 5

// HostFirewall returns what the last [Manager.OpenHostFirewall] found.
func (m *Manager) HostFirewall() HostFirewall {
	m.fwMu.Lock()
	defer m.fwMu.Unlock()
	if m.fw.State == "" {
		return HostFirewall{State: FirewallUnknown, Detail: "bothy has not looked at the host's firewall yet"}
	}
	return m.fw
}

// OpenHostFirewall finds the foreign filters on the sandboxes' path in the Manager's
// namespace (iptables' filter table, nft or legacy backend; firewalld's table; any other
// nftables base chain that drops by policy), makes sure that bothyd's accept rules are in
// iptables' filter table, exactly once, and that its interfaces are in firewalld's trusted
// zone, and returns (and keeps, for [Manager.HostFirewall]) what it found. It is idempotent,
// cheap where there is no foreign filter (one netlink listing), and logs a line only when the
// state differs from the last call's. It changes nothing else, and iptables' filter table
// only where one exists.
func (m *Manager) OpenHostFirewall() HostFirewall {
	m.fwMu.Lock()
	defer m.fwMu.Unlock()
	var fw HostFirewall
	if err := m.inHost(func() error { fw = m.openHostFirewall(); return nil }); err != nil {
		fw = HostFirewall{State: FirewallUnknown, Detail: err.Error()}
	}
	if fw != m.fw {
		msg := "network: the host's firewall lets the sandboxes' traffic through"
		log := m.log.Info
		if fw.State != FirewallOK {
			msg = "network: the host's firewall may block the sandboxes' traffic"
			if fw.State == FirewallBlocked {
				msg = "network: the host's firewall blocks the sandboxes' traffic"
			}
			log = m.log.Warn
		}
		log(msg, "host_firewall", fw.State, "detail", fw.Detail)
	}
	m.fw = fw
	return fw
}

// finding is one foreign filter's verdict.
type finding struct {
	state, detail string
}

// openHostFirewall does OpenHostFirewall's work on a thread in the Manager's namespace, so
// that the iptables commands it runs work there too (a child inherits the namespace of the
// thread that forks it).
func (m *Manager) openHostFirewall() HostFirewall {
	c, err := m.nft()
	if err != nil {
		return HostFirewall{State: FirewallUnknown, Detail: fmt.Sprintf("nftables could not be read: %v", err)}
	}
	chains, err := c.ListChains()
	if err != nil {
		return HostFirewall{State: FirewallUnknown, Detail: fmt.Sprintf("nftables' chains could not be listed: %v", err)}
	}
	found, xtNFT, firewalld := classify(c, chains)
	if firewalld != nil {
		found = append(found, openFirewalld(c, firewalld))
	}
	if xtNFT != nil {
		found = append(found, m.openXtables("iptables-nft", "nf_tables", xtNFT))
	}
	if legacyFilter() {
		// The legacy tables are not nftables: their policies are only seen through the
		// command, so each chain counts as present, its verdict unknown until then.
		found = append(found, m.openXtables("iptables-legacy", "legacy", &xtChains{legacy: true,
			forward: chainState{exists: true}, input: chainState{exists: true}}))
	}
	if len(found) == 0 {
		return HostFirewall{State: FirewallOK, Detail: "no other filter is on the sandboxes' path"}
	}
	fw := HostFirewall{State: FirewallOK}
	var details []string
	for _, f := range found {
		if rank(f.state) > rank(fw.State) {
			fw.State = f.state
		}
		details = append(details, f.detail)
	}
	fw.Detail = strings.Join(details, "; ")
	return fw
}

// classify judges the foreign base chains on the forward and input hooks: those that drop by
// policy are findings; iptables-nft's filter table and firewalld's table are returned, to be
// opened with their commands.
func classify(c *nftables.Conn, chains []*nftables.Chain) ([]finding, *xtChains, *nftables.Table) {
	var found []finding
	var xtNFT *xtChains
	var firewalld *nftables.Table
	for _, ch := range chains {
		if ch.Hooknum == nil || ch.Table == nil {
			continue
		}
		hook := *ch.Hooknum
		if hook != *nftables.ChainHookForward && hook != *nftables.ChainHookInput {
			continue
		}
		fam, tbl := ch.Table.Family, ch.Table.Name
		// Only IPv4 matters: the sandboxes have no other traffic (bothyd drops the rest).
		if fam != nftables.TableFamilyIPv4 && fam != nftables.TableFamilyINet {
			continue
		}
		drops := ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop
		switch {
		case fam == nftables.TableFamilyINet && tbl == tableName:
			// bothyd's own.
		case fam == nftables.TableFamilyIPv4 && tbl == "filter" && (ch.Name == "FORWARD" || ch.Name == "INPUT"):
			// iptables-nft's filter table: opened with the iptables command.
			if xtNFT == nil {
				xtNFT = &xtChains{}
			}
			st := chainState{exists: true, drops: drops}
			if rules, err := c.GetRules(ch.Table, ch); err != nil {
				st.rules = 1 // unread: it may have rules
			} else {
				st.rules = len(rules)
			}
			if ch.Name == "FORWARD" {
				xtNFT.forward = st
			} else {
				xtNFT.input = st
			}
		case fam == nftables.TableFamilyINet && tbl == "firewalld":
			firewalld = ch.Table
		case drops:
			found = append(found, finding{FirewallBlocked, fmt.Sprintf("the nftables chain %s of table %s %s drops by policy "+
				"what bothy's table does not decide, and bothy does not change other programs' nftables tables: accept "+
				"traffic in from and out to bothy's interfaces (iifname %q, oifname %q) there",
				ch.Name, familyName(fam), tbl, ifPrefix+"*", ifPrefix+"*")})
		}
	}
	return found, xtNFT, firewalld
}

// firewalldZone is the zone bothyd puts its interfaces in: its target accepts what comes in
// from them, to the host and forwarded. bothyd's own chains, at the same hooks, still drop
// what a sandbox's policy does not allow and everything to the host but its resolver.
const firewalldZone = "trusted"

// openFirewalld puts bothyd's interfaces ("sbxd+", a name firewalld matches as a prefix) in
// firewalld's trusted zone, through firewall-cmd, firewalld's sanctioned interface, in its
// runtime configuration only: bothyd leaves firewalld's permanent configuration to the host's
// owner, and looks again at its next start and at each sandbox's setup, so a reload of
// firewalld (which drops the runtime configuration) is repaired then. Interfaces that someone
// put in another zone stay there. Whether they are in a zone is read from firewalld's table,
// so a look where they are costs no command.
func openFirewalld(c *nftables.Conn, t *nftables.Table) finding {
	binding := ifPrefix + "+"
	zone, err := firewalldZoneOf(c, t)
	switch {
	case err != nil:
		return finding{FirewallUnknown, fmt.Sprintf("firewalld: its zones could not be read from table inet firewalld: %v", err)}
	case zone == firewalldZone:
		return finding{FirewallOK, fmt.Sprintf("firewalld: bothy's interfaces (%s) are in zone %s", binding, zone)}
	case zone != "":
		return finding{FirewallUnknown, fmt.Sprintf("firewalld: bothy's interfaces (%s) are in zone %s, which bothy leaves as it "+
			"was chosen; they need a zone that accepts forwarded traffic, such as %s", binding, zone, firewalldZone)}
	}
	p, err := exec.LookPath("firewall-cmd")
	if err != nil {
		return finding{FirewallUnknown, fmt.Sprintf("firewalld filters forwarded traffic by zone (table inet firewalld), and bothy "+
			"found no firewall-cmd to put its interfaces in a zone (%v): install firewalld's firewall-cmd, or run "+
			"firewall-cmd --permanent --zone=%s --add-interface=%s && firewall-cmd --reload", err, firewalldZone, binding)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), firewallCmdWait)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--zone="+firewalldZone, "--add-interface="+binding).CombinedOutput()
	if err != nil {
		return finding{FirewallBlocked, fmt.Sprintf("firewalld: firewall-cmd --zone=%s --add-interface=%s failed (%v: %s): "+
			"put bothy's interfaces in a zone that accepts forwarded traffic", firewalldZone, binding, err, strings.TrimSpace(string(out)))}
	}
	if zone, err := firewalldZoneOf(c, t); err != nil || zone != firewalldZone {
		return finding{FirewallUnknown, fmt.Sprintf("firewalld: firewall-cmd put bothy's interfaces (%s) in zone %s, and its table "+
			"does not show it (%q, %v)", binding, firewalldZone, zone, err)}
	}
	return finding{FirewallOK, fmt.Sprintf("firewalld: bothy put its interfaces (%s) in zone %s (runtime configuration: "+
		"a reload of firewalld drops it until bothy's next look)", binding, firewalldZone)}
}

// firewallCmdWait bounds a firewall-cmd run: a look runs under the Manager's lock.
const firewallCmdWait = 15 * time.Second

// firewalldZoneOf returns the zone firewalld dispatches forwarded traffic from bothyd's
// interfaces to ("" when none): the rule `iifname "sbxd*" goto filter_FWD_<zone>` of its
// chain filter_FORWARD_ZONES.
func firewalldZoneOf(c *nftables.Conn, t *nftables.Table) (string, error) {
	rules, err := c.GetRules(t, &nftables.Chain{Name: "filter_FORWARD_ZONES", Table: t})
	if err != nil {
		return "", err
	}
	for _, r := range rules {
		var iif, ours bool
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Meta:
				iif = e.Key == expr.MetaKeyIIFNAME
			case *expr.Cmp:
				ours = ours || iif && e.Op == expr.CmpOpEq && string(e.Data) == ifPrefix
			case *expr.Verdict:
				if zone, ok := strings.CutPrefix(e.Chain, "filter_FWD_"); ok && ours {
					return zone, nil
				}
			}
		}
	}
	return "", nil
}

func rank(state string) int {
	switch state {
	case FirewallBlocked:
		return 2
	case FirewallUnknown:
		return 1
	}
	return 0
}

func familyName(f nftables.TableFamily) string {
	if f == nftables.TableFamilyINet {
		return "inet"
	}
	return "ip"
}

// legacyFilter reports whether iptables-legacy's filter table is loaded in the calling
// thread's network namespace (thread-self: the thread may have entered another namespace
// than the process's).
func legacyFilter() bool {
	b, err := os.ReadFile("/proc/thread-self/net/ip_tables_names")
	if err != nil {
		return false
	}
	return slices.Contains(strings.Fields(string(b)), "filter")
}

// chainState is one built-in chain of iptables' filter table as nftables shows it.
type chainState struct {
	exists, drops bool
	rules         int // its rules, bothyd's own included
}

// xtChains is what is known of one backend's filter table before its command is run.
type xtChains struct {
	legacy         bool
	forward, input chainState
}

// openXtables puts bothyd's rules into one backend's filter table with its command, and
// judges what is left. mode is the backend's word in `iptables --version`.
func (m *Manager) openXtables(backend, mode string, known *xtChains) finding {
	ipt, err := xtablesCommand(backend, mode)
	if err != nil {
		if known.legacy {
			return finding{FirewallUnknown, fmt.Sprintf("iptables-legacy's filter table is loaded and bothy found no command "+
				"to read or open it (%v): install iptables", err)}
		}
		if known.forward.drops || known.input.drops {
			return finding{FirewallBlocked, fmt.Sprintf("iptables' filter table (nftables table ip filter) drops by policy, "+
				"and bothy found no command to open it (%v): install iptables", err)}
		}
		if known.forward.rules > 0 || known.input.rules > 0 {
			return finding{FirewallUnknown, fmt.Sprintf("iptables' filter table (nftables table ip filter) has rules, "+
				"and bothy found no command to read or open it (%v): install iptables", err)}
		}
		return finding{FirewallOK, "iptables' filter table accepts by policy and has no rules"}
	}
	var done []string
	open := func(chain string, rules [][]string, where string) error {
		if err := ensureRules(ipt, chain, rules); err != nil {
			return err
		}
		done = append(done, where)
		return nil
	}
	var errs []error
	chains, err := ipt.ListChains("filter")
	if err != nil {
		return finding{FirewallBlocked, fmt.Sprintf("%s: the filter table could not be listed: %v", backend, err)}
	}
	forward, err := ipt.List("filter", "FORWARD")
	if err != nil {
		return finding{FirewallBlocked, fmt.Sprintf("%s: the FORWARD chain could not be listed: %v", backend, err)}
	}
	if slices.Contains(chains, dockerUserChain) {
		errs = append(errs, open(dockerUserChain, fwForward, "DOCKER-USER"))
		// Rules put at the top of FORWARD before Docker came go: DOCKER-USER holds them now.
		for _, r := range fwForward {
			for range countRule(forward, r) {
				errs = append(errs, ipt.DeleteIfExists("filter", "FORWARD", r...))
			}
		}
	} else if needsOpening(forward) {
		errs = append(errs, open("FORWARD", fwForward, "the top of FORWARD"))
	}
	if known.input.exists {
		input, err := ipt.List("filter", "INPUT")
		if err != nil {
			errs = append(errs, err)
		} else if needsOpening(input) {
			errs = append(errs, open("INPUT", fwInput, "the top of INPUT (port 53 only)"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return finding{FirewallBlocked, fmt.Sprintf("%s: bothy could not add its accept rules to the filter table: %v", backend, err)}
	}
	if len(done) == 0 {
		return finding{FirewallOK, backend + ": the filter table accepts by policy and has no rules"}
	}
	return finding{FirewallOK, fmt.Sprintf("%s: bothy's accept rules for its interfaces are at %s", backend, strings.Join(done, " and "))}
}

// xtablesCommand finds the command of one backend: its own name (iptables-nft,
// iptables-legacy), or plain iptables when that is the backend's.
func xtablesCommand(backend, mode string) (*iptables.IPTables, error) {
	if p, err := exec.LookPath(backend); err == nil {
		return iptables.New(iptables.Path(p), iptables.Timeout(xtablesWait))
	}
	p, err := exec.LookPath("iptables")
	if err != nil {
		return nil, fmt.Errorf("neither %s nor iptables is in PATH", backend)
	}
	ctx, cancel := context.WithTimeout(context.Background(), xtablesWait*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", p, err)
	}
	if !strings.Contains(string(out), "("+mode+")") {
		return nil, fmt.Errorf("%s is not %s (%s)", p, backend, strings.TrimSpace(string(out)))
	}
	return iptables.New(iptables.Path(p), iptables.Timeout(xtablesWait))
}

// needsOpening reports whether a built-in chain, as `iptables -S` lists it, could drop: its
// policy is not ACCEPT, or it has rules other than bothyd's.
func needsOpening(lines []string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, "-P ") && !strings.HasSuffix(l, " ACCEPT") {
			return true
		}
		if strings.HasPrefix(l, "-A ") && !strings.Contains(l, "--comment bothy-") {
			return true
		}
	}
	return false
}

// ensureRules puts rules at the top of chain, in their order, each exactly once: a rule that
// is missing is inserted, a rule that is there more than once (a crash between two of the
// listing and the insert of two processes, say) loses its copies.
func ensureRules(ipt *iptables.IPTables, chain string, rules [][]string) error {
	lines, err := ipt.List("filter", chain)
	if err != nil {
		return err
	}
	for i := len(rules) - 1; i >= 0; i-- {
		r := rules[i]
		n := countRule(lines, r)
		if n == 0 {
			if err := ipt.Insert("filter", chain, 1, r...); err != nil {
				return err
			}
		}
		for ; n > 1; n-- {
			if err := ipt.Delete("filter", chain, r...); err != nil {
				return err
			}
		}
	}
	return nil
}

// countRule counts the lines of `iptables -S` that are rule r: its comment is its name.
func countRule(lines []string, r []string) int {
	comment := "--comment " + r[slices.Index(r, "--comment")+1] + " "
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "-A ") && strings.Contains(l+" ", comment) {
			n++
		}
	}
	return n
}
