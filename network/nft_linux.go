//go:build linux

package network

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The names of bothyd's nftables objects. Everything lives in one table of the inet family,
// owned by bothyd: nothing else adds to it, and bothyd touches no other table.
const (
	tableName     = "bothy"
	forwardChain  = "forward"
	inputChain    = "input"
	natChain      = "postrouting"
	redirectChain = "prerouting"
	interceptSet  = "intercept" // sandbox address . destination: to the egress proxy (EgressPort)
	neverSet      = "never"     // always denied: link-local, loopback, multicast, the pools
	privateSet    = "private"   // denied unless an allow entry inside them opens them
	gatewaysSet   = "gateways"  // the host ends of the sandboxes' subnets, where the resolvers listen
	dispatchMap   = "dispatch"  // host interface name -> jump to that sandbox's chain
	hostDenied    = "host-denied"
	sandboxPrefix = "sb-"
)

// The per-sandbox objects are named after the sandbox: its chain is "sb-<id>", and its sets
// and counters add one of these suffixes.
const (
	allowSuffix   = "-allow"  // allowed public CIDRs
	openSuffix    = "-open"   // allowed CIDRs inside a private range
	denySuffix    = "-deny"   // denied CIDRs
	pinnedSuffix  = "-pinned" // addresses answered for allowed names, each with its TTL
	neverSuffix   = "-never"  // counter: packets to always-denied addresses
	deniedSuffix  = "-denied" // counter: packets the policy denied
	objrefCounter = 1         // NFT_OBJECT_COUNTER
	ifNameSize    = unix.IFNAMSIZ
)

var table = &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName}

// setSuffixes and counterSuffixes are the per-sandbox sets and counters, for listing them.
var (
	setSuffixes     = []string{allowSuffix, openSuffix, denySuffix, pinnedSuffix}
	counterSuffixes = []string{neverSuffix, deniedSuffix}
)

func chainOf(id string) string { return sandboxPrefix + id }

// idOf returns the sandbox id of a per-sandbox object's name, given the suffixes its kind may
// have ("" for a chain).
func idOf(name string, suffixes ...string) (string, bool) {
	rest, ok := strings.CutPrefix(name, sandboxPrefix)
	if !ok {
		return "", false
	}
	if len(suffixes) == 0 {
		return rest, rest != ""
	}
	for _, s := range suffixes {
		if id, ok := strings.CutSuffix(rest, s); ok && id != "" {
			return id, true
		}
	}
	return "", false
}

func ifname(name string) []byte {
	b := make([]byte, ifNameSize)
	copy(b, name)
	return b
}

func ipv4Set(name string, interval, timeout bool) *nftables.Set {
	return &nftables.Set{Table: table, Name: name, KeyType: nftables.TypeIPAddr, Interval: interval, HasTimeout: timeout}
}

func counterObj(name string) *nftables.NamedObj {
	return &nftables.NamedObj{Table: table, Name: name, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}}
}

// intervals returns the elements of an interval set holding exactly the addresses of prefixes,
// which may overlap: the kernel refuses overlapping intervals, so they are merged first.
func intervals(prefixes []netip.Prefix) []nftables.SetElement {
	type span struct{ lo, hi uint64 } // hi is exclusive; 1<<32 is the end of the space
	var spans []span
	for _, p := range prefixes {
		b := p.Masked().Addr().As4()
		lo := uint64(binary.BigEndian.Uint32(b[:]))
		spans = append(spans, span{lo, lo + 1<<(32-p.Bits())})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 && s.lo <= merged[n-1].hi {
			merged[n-1].hi = max(merged[n-1].hi, s.hi)
			continue
		}
		merged = append(merged, s)
	}
	var elems []nftables.SetElement
	for _, s := range merged {
		elems = append(elems, nftables.SetElement{Key: be32(uint32(s.lo))})
		// An interval that runs to the end of the address space has no end element: there is
		// no address after it to name.
		if s.hi < 1<<32 {
			elems = append(elems, nftables.SetElement{Key: be32(uint32(s.hi)), IntervalEnd: true})
		}
	}
	return elems
}

func be32(v uint32) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, v)
	return b
}

func be16(v uint16) []byte {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, v)
	return b
}

// The expressions rules are made of, each loading into register 1 and comparing there.

func ifnameIs(key expr.MetaKey, op expr.CmpOp, name string) []expr.Any {
	// A name shorter than IFNAMSIZ without its NUL compares as a prefix, as nft's "sbxd*" does.
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte(name)},
	}
}

func nfproto(op expr.CmpOp, proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte{proto}},
	}
}

func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dportIs(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(port)},
	}
}

func ipv4Addr(offset uint32) *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}
}

// daddrIn matches an IPv4 destination in the named set; the caller has matched IPv4 first.
func daddrIn(set string) []expr.Any {
	return []expr.Any{ipv4Addr(16), &expr.Lookup{SourceRegister: 1, SetName: set}}
}

func daddrIs(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{ipv4Addr(16), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]}}
}

func saddrWithin(p netip.Prefix) []expr.Any {
	b := p.Masked().Addr().As4()
	mask := be32(^uint32(0) << (32 - p.Bits()))
	return []expr.Any{
		ipv4Addr(12),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]},
	}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
			Xor:  []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

// localToIIF matches a destination that is a local address of the interface the packet came
// in on (nft's "fib daddr . iif type local"): the kernel's lookup answers RTN_LOCAL only when
// the address's local route is on that interface.
func localToIIF() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, ResultADDRTYPE: true, FlagDADDR: true, FlagIIF: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

func count(name string) expr.Any { return &expr.Objref{Type: objrefCounter, Name: name} }

var (
	accept = &expr.Verdict{Kind: expr.VerdictAccept}
	drop   = &expr.Verdict{Kind: expr.VerdictDrop}
)

func rule(chain *nftables.Chain, parts ...any) *nftables.Rule {
	var exprs []expr.Any
	for _, p := range parts {
		switch p := p.(type) {
		case expr.Any:
			exprs = append(exprs, p)
		case []expr.Any:
			exprs = append(exprs, p...)
		}
	}
	return &nftables.Rule{Table: table, Chain: chain, Exprs: exprs}
}

// interceptKeyType is the key of the intercept set: a sandbox's address and a destination.
var interceptKeyType = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr)

func interceptSetOf() *nftables.Set {
	return &nftables.Set{Table: table, Name: interceptSet, KeyType: interceptKeyType, Concatenation: true, HasTimeout: true}
}

// interceptKey is the intercept set's key of a sandbox's address and a destination.
func interceptKey(sandbox, dst netip.Addr) []byte {
	s, d := sandbox.As4(), dst.As4()
	return append(s[:], d[:]...)
}

// redirectChainOf is the base chain that sends a sandbox's connections to the egress proxy.
func redirectChainOf() *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: redirectChain, Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept}
}

// baseChains returns bothyd's base chains. Their policy is accept: they only ever drop
// sandbox traffic, and must not decide for the rest of the host.
func baseChains() (forward, input, nat *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	forward = &nftables.Chain{Name: forwardChain, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	input = &nftables.Chain{Name: inputChain, Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	nat = &nftables.Chain{Name: natChain, Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept}
	return forward, input, nat
}

// addBase adds, to c's batch, the table, its base chains with their fixed rules and its shared
// sets, replacing any rules those chains had: it is idempotent, and it never touches the
// per-sandbox entries of the gateways set and the dispatch map.
func addBase(c *nftables.Conn, never []netip.Prefix, pools []netip.Prefix, uplink string) error {
	c.AddTable(table)
	forward, input, nat := baseChains()
	redirect := redirectChainOf()
	for _, ch := range []*nftables.Chain{forward, input, nat, redirect} {
		c.AddChain(ch)
		c.FlushChain(ch)
	}
	// The intercept set is not flushed: its entries are of sandboxes that outlive bothyd.
	intercept := interceptSetOf()
	if err := c.AddSet(intercept, nil); err != nil {
		return err
	}
	neverS, privateS := ipv4Set(neverSet, true, false), ipv4Set(privateSet, true, false)
	gateways := ipv4Set(gatewaysSet, false, false)
	dispatch := &nftables.Set{Table: table, Name: dispatchMap, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	for _, s := range []*nftables.Set{neverS, privateS, gateways, dispatch} {
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
	}
	c.FlushSet(neverS)
	c.FlushSet(privateS)
	if err := c.SetAddElements(neverS, intervals(append(slices.Clone(never), pools...))); err != nil {
		return err
	}
	if err := c.SetAddElements(privateS, intervals(privateRanges)); err != nil {
		return err
	}
	c.AddObj(counterObj(hostDenied))

	sbx := func(key expr.MetaKey) []expr.Any { return ifnameIs(key, expr.CmpOpEq, ifPrefix) }
	// Replies of connections a sandbox opened, and nothing else, come back in.
	c.AddRule(rule(forward, ctEstablished(), accept))
	c.AddRule(rule(forward, sbx(expr.MetaKeyIIFNAME), &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: dispatchMap, SetID: dispatch.ID, IsDestRegSet: true, DestRegister: 0}))
	// A sandbox interface without its chain in the map yet (or any more) gets nothing through.
	c.AddRule(rule(forward, sbx(expr.MetaKeyIIFNAME), drop))
	c.AddRule(rule(forward, sbx(expr.MetaKeyOIFNAME), drop))

	// The host answers a sandbox only on port 53 of its own gateway, where its resolver is: a
	// gateway address that is local to the interface the packet came in on. Every gateway is
	// an address of the host, so without the fib match a sandbox could query another's
	// resolver, under the other's policy.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(rule(input, sbx(expr.MetaKeyIIFNAME), nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), l4proto(proto),
			dportIs(53), daddrIn(gatewaysSet), localToIIF(), accept))
	}
	// The egress proxy's listener of a sandbox is on its gateway too, reached only through the
	// redirection below (a direct connection has no original destination, and is closed).
	c.AddRule(rule(input, sbx(expr.MetaKeyIIFNAME), nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), l4proto(unix.IPPROTO_TCP),
		dportIs(EgressPort), daddrIn(gatewaysSet), localToIIF(), accept))
	c.AddRule(rule(input, sbx(expr.MetaKeyIIFNAME), count(hostDenied), drop))

	// A sandbox's TCP connection to port 443 of an address its resolver answered for a host
	// name that a secret of its policy is bound to goes to the egress proxy, on its own
	// gateway (redirect: the primary address of the interface it came in on).
	c.AddRule(rule(redirect, sbx(expr.MetaKeyIIFNAME), nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), l4proto(unix.IPPROTO_TCP),
		dportIs(443), ipv4Addr(12), &expr.Payload{DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: interceptSet, SetID: intercept.ID},
		&expr.Immediate{Register: 1, Data: be16(EgressPort)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED}))

	for _, pool := range pools {
		out := ifnameIs(expr.MetaKeyOIFNAME, expr.CmpOpNeq, ifPrefix)
		if uplink != "" {
			out = ifnameIs(expr.MetaKeyOIFNAME, expr.CmpOpEq, uplink+"\x00")
		}
		c.AddRule(rule(nat, nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), saddrWithin(pool), out, &expr.Masq{}))
	}
	return nil
}

// addPolicy adds, to c's batch, a sandbox's chain, sets and counters filled for rules,
// replacing what they held: it is the whole of both a first setup and a live update, so that
// one transaction takes a sandbox from one policy to the next with no moment between.
func addPolicy(c *nftables.Conn, id string, rules *Rules, pins []pin) error {
	chain := c.AddChain(&nftables.Chain{Name: chainOf(id), Table: table})
	c.FlushChain(chain)
	name := chainOf(id)
	sets := map[string]*nftables.Set{}
	for _, suffix := range setSuffixes {
		s := ipv4Set(name+suffix, suffix != pinnedSuffix, suffix == pinnedSuffix)
		if err := c.AddSet(s, nil); err != nil {
			return err
		}
		c.FlushSet(s)
		sets[suffix] = s
	}
	for _, suffix := range counterSuffixes {
		c.AddObj(counterObj(name + suffix))
	}

	var allow, open, deny []netip.Prefix
	var allowPorts, openPorts, denyPorts []Entry
	for _, e := range rules.Deny {
		switch e.Kind {
		case Prefix:
			deny = append(deny, e.Prefix)
		case AddrPort:
			denyPorts = append(denyPorts, e)
		}
	}
	for _, e := range rules.Allow {
		switch {
		case e.Kind == Prefix && e.Private():
			open = append(open, e.Prefix)
		case e.Kind == Prefix:
			allow = append(allow, e.Prefix)
		case e.Kind == AddrPort && e.Private():
			openPorts = append(openPorts, e)
		case e.Kind == AddrPort:
			allowPorts = append(allowPorts, e)
		}
	}
	for suffix, prefixes := range map[string][]netip.Prefix{allowSuffix: allow, openSuffix: open, denySuffix: deny} {
		if err := c.SetAddElements(sets[suffix], intervals(prefixes)); err != nil {
			return err
		}
	}
	var pinned []nftables.SetElement
	for _, p := range pins {
		b := p.addr.As4()
		pinned = append(pinned, nftables.SetElement{Key: b[:], Timeout: p.timeout(), Comment: pinComment(p.name)})
	}
	if err := c.SetAddElements(sets[pinnedSuffix], pinned); err != nil {
		return err
	}

	denied, never := count(name+deniedSuffix), count(name+neverSuffix)
	// The order is the policy: what is never reachable, then deny entries, then private ranges
	// opened by name, then the rest of the private ranges closed, then allow entries, pinned
	// answers and, for the internet without an allow list, every other public address.
	c.AddRule(rule(chain, nfproto(expr.CmpOpNeq, unix.NFPROTO_IPV4), denied, drop))
	c.AddRule(rule(chain, daddrIn(neverSet), never, drop))
	c.AddRule(rule(chain, daddrIn(name+denySuffix), denied, drop))
	portRules(c, chain, denyPorts, denied, drop)
	c.AddRule(rule(chain, daddrIn(name+openSuffix), accept))
	portRules(c, chain, openPorts, accept)
	c.AddRule(rule(chain, daddrIn(privateSet), denied, drop))
	c.AddRule(rule(chain, daddrIn(name+allowSuffix), accept))
	portRules(c, chain, allowPorts, accept)
	c.AddRule(rule(chain, daddrIn(name+pinnedSuffix), accept))
	if rules.Internet && len(rules.Allow) == 0 {
		c.AddRule(rule(chain, accept))
	}
	c.AddRule(rule(chain, denied, drop))
	return nil
}

// portRules adds, for each address:port entry, one rule for TCP and one for UDP ending in
// verdict (preceded by a counter when one is given).
func portRules(c *nftables.Conn, chain *nftables.Chain, entries []Entry, tail ...expr.Any) {
	for _, e := range entries {
		for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			parts := []any{daddrIs(e.Prefix.Addr()), l4proto(proto), dportIs(e.Port)}
			for _, t := range tail {
				parts = append(parts, t)
			}
			c.AddRule(rule(chain, parts...))
		}
	}
}
