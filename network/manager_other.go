//go:build !linux

package network

import "github.com/bothy/bothy/platform"

// Manager is unsupported off Linux: veth pairs, network namespaces and nftables are Linux's.
// The stub exists so that the packages that hold a Manager build everywhere, and fail clearly
// when they try to use one.
type Manager struct{}

// New reports that sandbox networking needs Linux.
func New(cfg Config) (*Manager, error) { return nil, platform.ErrUnsupported }

func (m *Manager) Setup(id string, target Target, rules *Rules) (Attachment, error) {
	return Attachment{}, platform.ErrUnsupported
}
func (m *Manager) Update(id string, rules *Rules) error { return platform.ErrUnsupported }
func (m *Manager) Teardown(id string) error             { return platform.ErrUnsupported }
func (m *Manager) Recorded() ([]string, error)          { return nil, platform.ErrUnsupported }
func (m *Manager) Drops(id string) (Drops, error)       { return Drops{}, platform.ErrUnsupported }
func (m *Manager) Traffic(id string) (Traffic, error)   { return Traffic{}, platform.ErrUnsupported }
func (m *Manager) HostDrops() (uint64, error)           { return 0, platform.ErrUnsupported }
func (m *Manager) Refused() uint64                      { return 0 }
func (m *Manager) RefusedBy(id string) uint64           { return 0 }
func (m *Manager) Leftovers(live func(id string) bool) (Leftovers, error) {
	return Leftovers{}, platform.ErrUnsupported
}
func (m *Manager) Repair(l Leftovers) error { return platform.ErrUnsupported }
func (m *Manager) Close() error             { return nil }

// OpenHostFirewall and HostFirewall report that there is no sandbox network to let through.
func (m *Manager) OpenHostFirewall() HostFirewall {
	return HostFirewall{State: FirewallUnknown, Detail: "sandbox networking needs Linux"}
}
func (m *Manager) HostFirewall() HostFirewall { return m.OpenHostFirewall() }
