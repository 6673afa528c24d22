// Package network gives a sandbox egress by policy: a veth pair to the host with an address
// from a pool, NAT out of the host's uplink, a per-sandbox nftables chain that enforces the
// policy, and a resolver that answers only allowed names and pins their addresses. It is
// host-side and knows nothing of HTTP or of the supervisor: the caller says which sandbox, in
// which network namespace, under which [Rules].
//
// # Policy
//
// [Parse] validates a [Policy] ({internet, allow, deny}) into [Rules]. Entries are domains
// ("example.com"), wildcards ("*.example.org", every name below, not the apex), CIDRs or bare
// addresses, and address:port pairs (TCP and UDP), IPv4 only. Deny wins over allow; a
// non-empty allow list is the only thing reachable, whatever internet says; internet with no
// allow list opens every public address. Whatever the policy, the host itself (bothyd's API
// included), the other sandboxes (the whole pool), link-local and cloud metadata
// (169.254.0.0/16), loopback, multicast and reserved addresses are never reachable, and
// private ranges (RFC 1918, 100.64.0.0/10) only through an allow entry that lies inside one.
//
// # What is made, in what order
//
// [Manager.Setup] records the sandbox's allocation (its /30 and interface name) durably in
// the record directory first, so that a crash at any later point leaves a record naming what
// may exist. It then makes, in bothyd's own inet table, the sandbox's chain, sets and
// counters and its entry in the dispatch map (until that entry exists, the base chain drops
// everything from the interface), then the veth pair with the sandbox's end created directly
// in its namespace as eth0, the addresses and the default route, and last the resolver on the
// gateway. [Manager.Teardown] removes them in the reverse order and the record last; both are
// idempotent. [Manager.Leftovers] lists what has no live owner and [Manager.Repair] removes
// it, for `bothyd check --repair`.
//
// # DNS pinning
//
// Each networked sandbox has a resolver on port 53 of its gateway, and reaches no other: the
// input chain accepts a query only to a gateway that is local to the interface it came in on,
// and the resolver's sockets are bound to the sandbox's interface. It answers REFUSED for a
// name the policy does not allow (not NXDOMAIN: the name may exist, and a negative answer
// would be cached past a policy change), forwards the rest to the upstream, and before
// replying adds the answer's IPv4 addresses to the sandbox's pinned set for their TTL
// (bounded to 60 s .. 24 h). A connection to an address no allowed name resolved to, and no
// CIDR allows, is dropped and counted ([Manager.Drops]).
//
// # Invariants
//
// One Manager runs per host. bothyd owns the table "bothy" and every interface whose name
// starts with "sbxd"; it touches no other nftables table; of the host's own firewall it
// changes only iptables' filter table, where it keeps its accept rules for those interfaces,
// and firewalld's runtime zones, through firewall-cmd. [Manager.Update] replaces a policy in
// one nftables transaction: new connections follow it at once, established ones continue.
//
// # The host's own firewall
//
// A drop in any base chain of a hook is final, whatever bothyd's own chains accept, so
// Docker's and ufw's iptables rules (FORWARD policy DROP; ufw's INPUT too) and firewalld's
// zones would drop the sandboxes' traffic before bothyd's policy decides.
// [Manager.OpenHostFirewall], at bothyd's start and again at each [Manager.Setup], puts accept
// rules for "sbxd+" alone, tagged "bothy-sandboxes-*", into DOCKER-USER or at the top of
// FORWARD (and port 53 into INPUT), exactly once, with the iptables command of each backend
// present (nft, legacy), and puts "sbxd+" in firewalld's trusted zone (runtime configuration,
// with firewall-cmd); bothyd's own chains still drop what the policy forbids. What it cannot
// open is reported ([Manager.HostFirewall]): a foreign nftables chain that drops by policy, a
// missing command, interfaces someone put in another zone. The rules stay when bothyd stops:
// the sandboxes outlive it.
package network
