//go:build linux

package egress

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// originalDst returns where a connection that nftables redirected (dnat) was going, from the
// connection tracking entry (SO_ORIGINAL_DST): the address the sandbox's filter allowed.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	for {
		u, ok := c.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		c = u.Unwrap()
	}
	if r, ok := c.(*releasing); ok {
		c = r.Conn
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("egress: not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		// struct sockaddr_in fits the 16 bytes of an ipv6_mreq: family, port, address.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		port := binary.BigEndian.Uint16(b[2:4])
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port)
	})
	if err == nil {
		err = serr
	}
	return ap, err
}
