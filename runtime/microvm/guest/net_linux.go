//go:build linux

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// configureNIC gives the guest's NIC the sandbox's address (the only one it keeps), brings lo
// and it up and routes everything through gateway: what the host's network.Manager does for a
// namespace sandbox's eth0, done here because the address is the guest's NIC's. Every step
// replaces what is there, so a second call (the supervisor's re-adopt after a restart of
// bothyd) changes nothing. The NIC's neighbours are forgotten: in a guest restored from a
// memory generation they are its source's (the gateway's MAC is the source's veth end's, and
// the gateway may be another's address now), and a stale entry would hold its traffic until
// it expires. The NIC gets a MAC of its address (nicMAC) before anything is sent from it, so
// that a clone, whose NIC has its source's MAC in the saved device state, has one of its own.
// The zero address takes the NIC down instead (see downNIC).
func configureNIC(_ context.Context, address netip.Prefix, gateway netip.Addr) error {
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	l, err := netlink.LinkByName(NIC)
	if !address.IsValid() {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil // no NIC: nothing to take down
		}
		if err != nil {
			return fmt.Errorf("find %s: %w", NIC, err)
		}
		return downNIC(l)
	}
	if err != nil {
		return fmt.Errorf("this VM has no %s: %w", NIC, err)
	}
	if err := setMAC(l, nicMAC(address.Addr())); err != nil {
		return err
	}
	want := &net.IPNet{IP: address.Addr().AsSlice(), Mask: net.CIDRMask(address.Bits(), 32)}
	if err := keepOnly(l, want.IP); err != nil {
		return err
	}
	if err := netlink.AddrReplace(l, &netlink.Addr{IPNet: want}); err != nil {
		return fmt.Errorf("address %s: %w", NIC, err)
	}
	if err := flushNeighbours(l); err != nil {
		return err
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

// macPrefix begins every NIC's MAC: 0x02 is a locally administered unicast address (the
// second bit of the first byte set, the first clear), never a vendor's; 0x73 is bothyd's
// mark.
var macPrefix = [2]byte{0x02, 0x73}

// nicMAC is the guest NIC's MAC for the sandbox's IPv4 address: the prefix and the address's
// four bytes. Addresses are unique among the host's sandboxes (the network Manager allocates
// them), so are the MACs; a clone's re-address gives it a new one, as its new veth's layer 2
// would need nothing more (the redirect between eth0 and the tap is by device, not by MAC).
func nicMAC(addr netip.Addr) net.HardwareAddr {
	a := addr.Unmap().As4()
	return net.HardwareAddr{macPrefix[0], macPrefix[1], a[0], a[1], a[2], a[3]}
}

// setMAC gives l the hardware address mac unless it has it. virtio-net changes it live when
// the device offers VIRTIO_NET_F_CTRL_MAC_ADDR (QEMU's virtio-net-pci does by default), and
// tells the device, whose receive filter would drop frames to an address it does not know;
// a driver that cannot change it while the link is up (EBUSY) gets it down first, and
// configureNIC brings it up again.
func setMAC(l netlink.Link, mac net.HardwareAddr) error {
	if bytes.Equal(l.Attrs().HardwareAddr, mac) {
		return nil
	}
	err := netlink.LinkSetHardwareAddr(l, mac)
	if errors.Is(err, unix.EBUSY) {
		if err = netlink.LinkSetDown(l); err == nil {
			err = netlink.LinkSetHardwareAddr(l, mac)
		}
	}
	if err != nil {
		return fmt.Errorf("set the MAC of %s to %s: %w", NIC, mac, err)
	}
	return nil
}

// downNIC takes the NIC down with nothing left of an address: a clone without a network of a
// guest that had one keeps no address, route or neighbour of its source's.
func downNIC(l netlink.Link) error {
	if err := netlink.LinkSetDown(l); err != nil {
		return fmt.Errorf("take %s down: %w", NIC, err)
	}
	if err := keepOnly(l, nil); err != nil {
		return err
	}
	routes, err := netlink.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list the routes of %s: %w", NIC, err)
	}
	for _, r := range routes {
		if err := netlink.RouteDel(&r); err != nil && !gone(err) {
			return fmt.Errorf("remove a route of %s: %w", NIC, err)
		}
	}
	return flushNeighbours(l)
}

// keepOnly removes every IPv4 address of l other than keep (all of them for nil).
func keepOnly(l netlink.Link, keep net.IP) error {
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list the addresses of %s: %w", NIC, err)
	}
	for _, a := range addrs {
		if keep != nil && a.IP.Equal(keep) {
			continue
		}
		if err := netlink.AddrDel(l, &a); err != nil && !gone(err) {
			return fmt.Errorf("remove %s from %s: %w", a.IPNet, NIC, err)
		}
	}
	return nil
}

// flushNeighbours forgets every IPv4 neighbour of l.
func flushNeighbours(l netlink.Link) error {
	neighs, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list the neighbours of %s: %w", NIC, err)
	}
	for _, n := range neighs {
		if err := netlink.NeighDel(&n); err != nil && !gone(err) {
			return fmt.Errorf("forget the neighbour %s of %s: %w", n.IP, NIC, err)
		}
	}
	return nil
}

// gone reports netlink's answers for an entry that went meanwhile (a route that went with its
// address, a neighbour that expired).
func gone(err error) bool {
	return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EADDRNOTAVAIL)
}
