package control

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
)

// FeatureNetwork is announced by an agent whose Handler is also a [NetworkConfigurer]: a
// microVM guest's, whose NIC is its own to configure (a namespace sandbox's eth0 is
// configured from the host, in its namespace). It is not among [RequiredFeatures].
const FeatureNetwork = "network"

// FeatureNetworkDown is announced by an agent whose network operation also takes the empty
// request (no address, no gateway), which takes eth0 down: a restored guest's NIC, whose
// address was its source's, when the clone has no network. An agent of an older build (one
// that runs on in a memory generation's saved memory) announces [FeatureNetwork] alone.
const FeatureNetworkDown = "network-down"

// OpNetwork gives the sandbox's eth0 its address and default route (see [NetworkRequest]).
const OpNetwork Op = "network"

// NetworkRequest is the header of a network operation: the sandbox's address with its
// subnet's length (as 10.250.0.2/30) and the gateway, its host's end of the subnet, which
// must lie in that subnet. The agent gives eth0 exactly that address (replacing any other),
// forgets eth0's neighbours (a restored guest's gateway has another MAC), brings lo and eth0
// up and routes everything through the gateway. Both empty ([FeatureNetworkDown]) take
// eth0's addresses, routes and neighbours away and the link down. It is idempotent.
type NetworkRequest struct {
	Address string `json:"address"`
	Gateway string `json:"gateway"`
}

// Down reports whether the request takes eth0 down.
func (r *NetworkRequest) Down() bool { return r.Address == "" && r.Gateway == "" }

// Parse validates the request: IPv4, the gateway in the address's subnet and not the
// address itself; or the empty request, which parses to the zero prefix and address (down).
func (r *NetworkRequest) Parse() (netip.Prefix, netip.Addr, error) {
	if r.Down() {
		return netip.Prefix{}, netip.Addr{}, nil
	}
	p, err := netip.ParsePrefix(r.Address)
	if err != nil || !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 30 {
		return netip.Prefix{}, netip.Addr{}, invalidf("The address must be an IPv4 address with a subnet of /8 to /30, as 10.0.0.2/30.")
	}
	gw, err := netip.ParseAddr(r.Gateway)
	if err != nil || !gw.Is4() || !p.Masked().Contains(gw) || gw == p.Addr() {
		return netip.Prefix{}, netip.Addr{}, invalidf("The gateway must be another IPv4 address of the address's subnet.")
	}
	return p, gw, nil
}

// Validate checks the request.
func (r *NetworkRequest) Validate() error {
	_, _, err := r.Parse()
	return err
}

// NetworkConfigurer is what a [Handler] implements to serve network (and so also
// [FeatureNetworkDown]): the zero address and gateway take eth0 down.
type NetworkConfigurer interface {
	ConfigureNetwork(ctx context.Context, address netip.Prefix, gateway netip.Addr) error
}

// serveNetwork answers a network operation.
func (s *server) serveNetwork(ctx context.Context, req *NetworkRequest) error {
	n, ok := s.h.(NetworkConfigurer)
	if !ok {
		return invalidf("This agent does not serve %s.", OpNetwork)
	}
	addr, gw, err := req.Parse()
	if err != nil {
		return err
	}
	return n.ConfigureNetwork(ctx, addr, gw)
}

// ConfigureNetwork has the agent give the sandbox's eth0 address (with its subnet) and route
// it through gateway. It refuses an agent that does not announce [FeatureNetwork].
func (c *Client) ConfigureNetwork(ctx context.Context, address netip.Prefix, gateway netip.Addr) error {
	if !slices.Contains(c.hello.Features, FeatureNetwork) {
		return fmt.Errorf("control: the agent (%s) does not serve %s", c.hello.AgentVersion, OpNetwork)
	}
	return c.roundTrip(ctx, Header{Op: OpNetwork, Network: &NetworkRequest{Address: address.String(), Gateway: gateway.String()}}, nil)
}

// DropNetwork has the agent take the sandbox's eth0 down: no address, route or neighbour
// left. It refuses an agent that does not announce [FeatureNetworkDown].
func (c *Client) DropNetwork(ctx context.Context) error {
	if !slices.Contains(c.hello.Features, FeatureNetworkDown) {
		return fmt.Errorf("control: the agent (%s) cannot take its network down", c.hello.AgentVersion)
	}
	return c.roundTrip(ctx, Header{Op: OpNetwork, Network: &NetworkRequest{}}, nil)
}
