//go:build linux

package guest

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// configureNIC gives the guest's NIC the sandbox's address (the only one it keeps), brings lo
// and it up and routes everything through gateway: what the host's network.Manager does for a
// namespace sandbox's eth0, done here because the address is the guest's NIC's. Every step
// replaces what is there, so a second call (the supervisor's re-adopt after a restart of
// sandboxd) changes nothing.
func configureNIC(_ context.Context, address netip.Prefix, gateway netip.Addr) error {
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	l, err := netlink.LinkByName(NIC)
	if err != nil {
		return fmt.Errorf("this VM has no %s: %w", NIC, err)
	}
	want := &net.IPNet{IP: address.Addr().AsSlice(), Mask: net.CIDRMask(address.Bits(), 32)}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list the addresses of %s: %w", NIC, err)
	}
	for _, a := range addrs {
		if !a.IP.Equal(want.IP) {
			_ = netlink.AddrDel(l, &a)
		}
	}
	if err := netlink.AddrReplace(l, &netlink.Addr{IPNet: want}); err != nil {
		return fmt.Errorf("address %s: %w", NIC, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bring %s up: %w", NIC, err)
	}
	route := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gateway.AsSlice()}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("route through %s: %w", gateway, err)
	}
	return nil
}
