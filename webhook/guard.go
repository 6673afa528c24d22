package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// ErrPrivateAddress is wrapped by the error of a delivery, or a create, whose address is one
// the host or its sandboxes keep private (see the package doc).
var ErrPrivateAddress = errors.New("webhook: the address is private")

// reserved are the ranges beyond those netip classifies that no receiver may be in: they are
// not routed on the internet, or reach the host or its neighbours.
var reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // shared address space (RFC 6598, carrier NAT)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the broadcast address
	netip.MustParsePrefix("100::/64"),        // discard
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
}

// embeddedV4 are IPv6 ranges that carry an IPv4 address a translator or tunnel would reach:
// the embedded address is judged too, so that 64:ff9b::7f00:1 is not a way to 127.0.0.1.
var embeddedV4 = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b::/96"),   // NAT64, the last 32 bits
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64: private by definition
	netip.MustParsePrefix("2002::/16"),      // 6to4, bits 16–47
}

// guard decides which addresses deliveries may connect to.
type guard struct {
	allowPrivate bool
	deny         []netip.Prefix
}

// check returns nil for an address a delivery may connect to.
func (g guard) check(ip netip.Addr) error {
	if g.allowPrivate {
		return nil
	}
	ip = ip.Unmap()
	if why := privateKind(ip); why != "" {
		return fmt.Errorf("%w: %s is %s", ErrPrivateAddress, ip, why)
	}
	for _, p := range g.deny {
		if p.Contains(ip) {
			return fmt.Errorf("%w: %s is in the sandbox subnet %s", ErrPrivateAddress, ip, p)
		}
	}
	if ip.Is6() {
		for _, p := range embeddedV4 {
			if !p.Contains(ip) {
				continue
			}
			if p.Bits() == 48 {
				return fmt.Errorf("%w: %s is a local-use NAT64 address", ErrPrivateAddress, ip)
			}
			b := ip.As16()
			var v4 netip.Addr
			if p.Bits() == 96 {
				v4 = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
			} else {
				v4 = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
			}
			if err := g.check(v4); err != nil {
				return fmt.Errorf("%w (embedded in %s)", err, ip)
			}
		}
	}
	return nil
}

// privateKind says what kind of non-public address ip is, or "" for a public one.
func privateKind(ip netip.Addr) string {
	switch {
	case !ip.IsValid():
		return "not an address"
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsUnspecified():
		return "the unspecified address"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "a link-local address"
	case ip.IsPrivate():
		return "a private address (RFC 1918 or ULA)"
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return "a multicast address"
	}
	for _, p := range reserved {
		if p.Contains(ip) {
			return "a reserved address (" + p.String() + ")"
		}
	}
	return ""
}

// control is the dialer's Control hook: it runs on the address the dialer is about to connect
// to, after resolution, for every address it tries.
func (g guard) control(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: %q is not an address", ErrPrivateAddress, address)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%w: %q is not an address", ErrPrivateAddress, host)
	}
	return g.check(ip.WithZone(""))
}
