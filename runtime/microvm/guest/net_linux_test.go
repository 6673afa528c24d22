//go:build linux

package guest

import (
	"net/netip"
	"testing"
)

// TestNICMAC: a NIC's MAC is a locally administered unicast address made of its IPv4
// address, so two sandboxes (a clone and its source) of different addresses have different
// MACs, and one address always the same.
func TestNICMAC(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr string
		want string
	}{
		{"10.88.0.5", "02:73:0a:58:00:05"},
		{"10.88.0.6", "02:73:0a:58:00:06"},
		{"192.168.255.254", "02:73:c0:a8:ff:fe"},
		{"::ffff:10.88.0.5", "02:73:0a:58:00:05"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			t.Parallel()
			mac := nicMAC(netip.MustParseAddr(tc.addr))
			if mac.String() != tc.want {
				t.Fatalf("nicMAC(%s) = %s, want %s", tc.addr, mac, tc.want)
			}
			if mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
				t.Fatalf("nicMAC(%s) = %s is not a locally administered unicast address", tc.addr, mac)
			}
		})
	}
}
