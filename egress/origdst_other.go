//go:build !linux

package egress

import (
	"errors"
	"net"
	"net/netip"
)

// originalDst needs Linux's connection tracking: the proxy serves only sandboxes whose
// filter redirects to it, and only Linux has those.
func originalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("egress: unsupported on this OS")
}
