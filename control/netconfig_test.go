package control

import (
	"context"
	"net/netip"
	"slices"
	"testing"
)

type netHandler struct {
	*fakeHandler
	got []string
}

func (n *netHandler) ConfigureNetwork(_ context.Context, address netip.Prefix, gateway netip.Addr) error {
	if !address.IsValid() && !gateway.IsValid() {
		n.got = append(n.got, "down")
		return nil
	}
	n.got = append(n.got, address.String()+" via "+gateway.String())
	return nil
}

// TestConfigureNetwork: an agent whose handler configures networks announces it and gets the
// address and gateway as sent; one whose handler does not is never asked (the client refuses),
// and a request outside the rules is refused before the handler sees it. The empty request
// takes the network down, and only an agent that announces it is sent one.
func TestConfigureNetwork(t *testing.T) {
	h := &netHandler{fakeHandler: newFake()}
	c, _ := dial(t, h)
	if !slices.Contains(c.Features(), FeatureNetwork) {
		t.Fatalf("features %v lack %s", c.Features(), FeatureNetwork)
	}
	addr, gw := netip.MustParsePrefix("10.250.0.2/30"), netip.MustParseAddr("10.250.0.1")
	if err := c.ConfigureNetwork(context.Background(), addr, gw); err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.250.0.2/30 via 10.250.0.1"}; !slices.Equal(h.got, want) {
		t.Fatalf("the handler got %v; want %v", h.got, want)
	}
	if !slices.Contains(c.Features(), FeatureNetworkDown) {
		t.Fatalf("features %v lack %s", c.Features(), FeatureNetworkDown)
	}
	if err := c.DropNetwork(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.250.0.2/30 via 10.250.0.1", "down"}; !slices.Equal(h.got, want) {
		t.Fatalf("the handler got %v; want %v", h.got, want)
	}
	h.got = h.got[:1]
	for _, bad := range []NetworkRequest{
		{Address: "10.250.0.2/30"},                        // an address without a gateway
		{Gateway: "10.250.0.1"},                           // a gateway without an address
		{Address: "10.250.0.2/30", Gateway: "10.250.0.9"}, // not in the subnet
		{Address: "10.250.0.2/30", Gateway: "10.250.0.2"}, // the address itself
		{Address: "fd00::2/64", Gateway: "fd00::1"},
		{Address: "10.250.0.2", Gateway: "10.250.0.1"},
	} {
		if err := c.roundTrip(context.Background(), Header{Op: OpNetwork, Network: &bad}, nil); err == nil {
			t.Errorf("the request %+v was taken", bad)
		}
	}
	if len(h.got) != 1 {
		t.Fatalf("refused requests reached the handler: %v", h.got)
	}

	plain, _ := dial(t, newFake())
	if slices.Contains(plain.Features(), FeatureNetwork) {
		t.Fatalf("an agent without a configurer announces %s", FeatureNetwork)
	}
	if err := plain.ConfigureNetwork(context.Background(), addr, gw); err == nil {
		t.Fatal("the client sent network to an agent that does not serve it")
	}
	if err := plain.DropNetwork(context.Background()); err == nil {
		t.Fatal("the client sent a network down to an agent that does not serve it")
	}
}
