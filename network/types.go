package network

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
)

// Config configures a [Manager].
type Config struct {
	// Dir is the directory of the allocation records; it must exist and be bothyd's alone.
	Dir string
	// Pool is where sandbox subnets come from (--network-pool); zero means [DefaultPool].
	Pool netip.Prefix
	// Uplink, when set, is the only interface sandbox traffic is masqueraded out of; when
	// empty, traffic leaving by any interface that is not a sandbox's is.
	Uplink string
	// Upstream is the resolver allowed names are forwarded to, as host:port (--dns-upstream);
	// empty means the first nameserver of the host's /etc/resolv.conf.
	Upstream string
	// HostNS, when set, is the network namespace the Manager works in instead of the calling
	// process's: the tests give it a namespace of their own, so that nothing they do reaches
	// the real host's network.
	HostNS *os.File
	// Log receives what the Manager does to the host; nil means slog.Default().
	Log *slog.Logger
	// Egress, when set, is the egress proxy of the sandboxes whose policy binds a secret; a
	// policy with secrets is refused at setup without it.
	Egress Egress
	// OnRefused, when set, is called for every name a sandbox's resolver refuses, with the
	// sandbox's id; it must not block.
	OnRefused func(id, name string)
}

// EgressPort is the port of the egress proxy's listener on a sandbox's gateway.
const EgressPort = 15443

// Egress is the egress proxy as the Manager drives it (package egress, through cmd/bothyd).
type Egress interface {
	// Serve serves sandbox id's redirected connections on ln under its bindings; allowed
	// says whether a connection's original destination is one the proxy may dial (an address
	// the sandbox's resolver answered for a bound name, port 443, within its TTL).
	Serve(id string, ln net.Listener, secrets []SecretBinding, allowed func(netip.AddrPort) bool) error
	// Update replaces a served sandbox's bindings.
	Update(id string, secrets []SecretBinding)
	// Stop stops serving a sandbox and closes its listener and connections.
	Stop(id string)
}

// Target names the network namespace of a sandbox: its init's pid, or an open namespace file.
type Target struct {
	PID int
	NS  *os.File
	// Adopt says that the sandbox ran, networked, under an earlier bothyd: what its resolver
	// pinned and intercepted is still in the kernel's sets, and what of it the policy still
	// allows is kept (docs/secrets.md, "After a restart of bothyd"), where a first set-up
	// starts empty.
	Adopt bool
}

// Attachment is what a sandbox got: the caller writes Gateway into its resolv.conf.
type Attachment struct {
	// Interface is the host end of the veth pair; the sandbox's end is eth0.
	Interface string
	// Subnet is the sandbox's /30; Gateway is the host's end of it, where the sandbox's
	// resolver listens, and Address the sandbox's.
	Subnet           netip.Prefix
	Gateway, Address netip.Addr
}

// Drops are the packets a sandbox's filter dropped since its setup. They count packets, not
// connections: a client that retries a refused connect counts each try.
type Drops struct {
	// AlwaysDenied went to addresses no policy opens: link-local and cloud metadata, loopback,
	// multicast, and the other sandboxes.
	AlwaysDenied uint64
	// Policy went to addresses the sandbox's policy does not allow.
	Policy uint64
}

// Traffic is what a sandbox's interface carried since its setup, in bytes, as the sandbox
// sees it: In arrived at the sandbox, Out left it. It is read from the host end of the veth
// pair, whose receive side is the sandbox's send side.
type Traffic struct {
	InBytes, OutBytes uint64
}

// Leftovers are network resources with no live owner, as [Manager.Leftovers] finds them.
type Leftovers struct {
	// Records are sandbox ids whose allocation record has no live sandbox; everything the
	// record names goes with it.
	Records []string
	// Interfaces are host interfaces of bothyd's name that no record names.
	Interfaces []string
	// Chains, Sets and Counters are per-sandbox nftables objects of a sandbox with no record.
	Chains, Sets, Counters []string
	// Gateways are entries of the gateways set that no record names.
	Gateways []netip.Addr
	// Intercepts are sandbox addresses with entries in the intercept set (the egress proxy's
	// redirection) that no record names.
	Intercepts []netip.Addr
	// Temp are leftovers of interrupted durable writes in the record directory.
	Temp []string
}

// Empty reports whether nothing is left over.
func (l Leftovers) Empty() bool {
	return len(l.Records)+len(l.Interfaces)+len(l.Chains)+len(l.Sets)+len(l.Counters)+len(l.Gateways)+len(l.Intercepts)+len(l.Temp) == 0
}

// String lists the leftovers for `bothyd check`, one kind a line.
func (l Leftovers) String() string {
	var b strings.Builder
	line := func(what string, items []string) {
		if len(items) > 0 {
			fmt.Fprintf(&b, "%s: %s\n", what, strings.Join(items, ", "))
		}
	}
	line("network records without a sandbox", l.Records)
	line("sandbox interfaces without a record", l.Interfaces)
	line("nftables chains without a record", l.Chains)
	line("nftables sets without a record", l.Sets)
	line("nftables counters without a record", l.Counters)
	var gws []string
	for _, g := range l.Gateways {
		gws = append(gws, g.String())
	}
	line("gateway addresses without a record", gws)
	var ics []string
	for _, a := range l.Intercepts {
		ics = append(ics, a.String())
	}
	line("egress redirections of sandbox addresses without a record", ics)
	line("interrupted record writes", l.Temp)
	return b.String()
}

// The states of the host's firewall, as [HostFirewall.State] says them.
const (
	// FirewallOK: no foreign filter on the sandboxes' path drops their traffic, or bothyd
	// opened every one that would.
	FirewallOK = "ok"
	// FirewallBlocked: a foreign filter drops the sandboxes' traffic and bothyd could not
	// open it; the detail says which, and what to do.
	FirewallBlocked = "blocked"
	// FirewallUnknown: a foreign filter is on the path whose verdict bothyd cannot judge
	// (its interfaces in a firewalld zone someone else chose, iptables-legacy or firewalld
	// without its command).
	FirewallUnknown = "unknown"
)

// HostFirewall is what the host's own firewall (Docker's, ufw's, firewalld's rules) does to
// the sandboxes' traffic, as the Manager last found it.
type HostFirewall struct {
	// State is FirewallOK, FirewallBlocked or FirewallUnknown.
	State string
	// Detail says what was found and what bothyd did, or what the host's owner must do.
	Detail string
}
