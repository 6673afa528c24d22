// Package guest is the sandbox side of the microvm runtime inside the VM: the guest's init,
// PID 1 of the guest kernel, run from the initramfs that the host-side driver builds. It
// loads the virtio drivers (modules of the Debian cloud kernel, in dependency order), opens
// the virtio-serial port that the shim on the host holds the other end of, reads the
// launch's configuration from it, mounts the root disk and makes it /, and runs the agent
// ([agent.Run]) as PID 1 with a listener that takes each session the host opens on the port
// (package [portmux]) as one connection. When the agent returns (a shutdown request, or TERM)
// it powers the VM off, which ends QEMU and so the launch.
//
// It imports nothing of the host side. What it shares with the driver and the shim is the
// layout of the initramfs and [Config], declared here.
package guest

import "strconv"

// Command is the argument the kernel passes the initramfs's /init (after "--" on its command
// line): the binary's dispatcher runs [Main] for it.
const Command = "__vminit"

// The initramfs's layout and the guest's devices.
const (
	// ModulesDir holds the kernel modules, <name>.ko, and ModulesOrder lists their names in
	// the order they load.
	ModulesDir   = "/modules"
	ModulesOrder = "/modules/order"
	// RootDevice is the root disk.
	RootDevice = "/dev/vda"
	// MachineIDFile is the guest's machine id, which each launch and each restore writes anew.
	MachineIDFile = "/etc/machine-id"
)

// PortDevices are the two virtio-serial ports of the control sessions (ports 1 and 2 of the
// first virtio-serial device). A boot says ready, takes its configuration and serves on the
// first; the other stays idle, read only for a [Restore]. A guest restored from a memory state
// serves on the port that was idle when the state was saved, so that no half-sent frame of the
// saved VM's sessions (bytes that were in flight on the active port) is ever read as a frame
// of the new launch's; the port it served on before becomes the idle one, reopened.
var PortDevices = [2]string{"/dev/vport0p1", "/dev/vport0p2"}

// Modules are the kernel modules the guest loads, in order: the virtio core and PCI
// transport (modern and legacy libraries, which virtio_pci links either way), the console
// (virtio-serial), the block device and the NIC (virtio_net, which links net_failover and
// failover), and FUSE with its virtio transport (virtiofs), which the volumes are mounted
// with. The NIC's driver is loaded whether or not the VM has one: a microVM whose
// policy gives it no network has no NIC, so only lo.
var Modules = []string{
	"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci",
	"virtio_console", "virtio_blk", "failover", "net_failover", "virtio_net", "fuse", "virtiofs",
}

// NIC is the guest's network interface when the VM has one.
const NIC = "eth0"

// Config is what the shim sends the guest in the port's first frame: never in a file or on
// the kernel's command line, which the sandbox can read.
type Config struct {
	Capability []byte            `json:"capability"`
	Hostname   string            `json:"hostname"`
	Env        map[string]string `json:"env,omitempty"`
	// MachineID is written to /etc/machine-id (32 hex digits), so that no two sandboxes share one.
	MachineID string `json:"machine_id,omitempty"`
	// RealtimeNS is the host's CLOCK_REALTIME when the shim sent the frame, which the guest
	// sets its clock to: the RTC the kernel read at boot counts whole seconds, so a guest's
	// clock would start up to a second behind the host's.
	RealtimeNS int64 `json:"realtime_ns,omitempty"`
	// Volumes are the volumes the guest mounts, each a virtio-fs device of the VM whose tag
	// is [VolumeTag] of its index.
	Volumes []Volume `json:"volumes,omitempty"`
	// Probe asks the guest only to say it listens and to power off: the accelerator probe.
	Probe bool `json:"probe,omitempty"`
}

// Volume is a volume the guest mounts (runtime.VolumeMount's target and mode; its source is
// the host's, which the guest never learns).
type Volume struct {
	Tag      string `json:"tag"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// VolumeTag is the virtio-fs tag of the i-th volume of a launch.
func VolumeTag(i int) string { return "bothyvol" + strconv.Itoa(i) }

// Restore is what the shim of a launch that restores a memory state sends the guest (frame
// portmux.FrameRestore, on the port that was idle at the save): the guest runs on from the
// saved state, and this makes it the new launch's. Every clone of one state is made unique by
// it: its own host name and machine id, its kernel's RNG reseeded with fresh host bytes (the
// saved pool is every clone's), and its clock advanced over the time the state lay saved.
type Restore struct {
	Capability []byte `json:"capability"`
	Hostname   string `json:"hostname"`
	MachineID  string `json:"machine_id"`
	// Entropy is credited to the guest's RNG (RNDADDENTROPY).
	Entropy []byte `json:"entropy"`
	// ClockAdvanceNS is added to the guest's CLOCK_REALTIME: the state's downtime, as the
	// supervisor measured it by the generation's time contract.
	ClockAdvanceNS int64 `json:"clock_advance_ns"`
}
