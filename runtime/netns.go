package runtime

import "os"

// NetNSer is a Runtime whose sandboxes have a network namespace of their own on this host,
// which the supervisor gives a network interface when a sandbox's policy asks for one. A
// runtime without it (a virtual machine's network is its own) cannot give sandboxes egress.
type NetNSer interface {
	// NetNS returns the host pid of the init of the sandbox whose state directory is dir (a
	// live, verified process, as Processes finds it), whose network namespace is the
	// sandbox's. The pid names that process only while it lives: the caller opens its
	// namespace and checks that the init is still the runtime process's child after.
	NetNS(dir string) (pid int, err error)
}

// GuestNetworker is a NetNSer whose sandbox's network interface is a guest's behind the
// namespace (a VM's NIC on a tap device in it) rather than the namespace's own. After the
// supervisor's network.Manager has made eth0 in the namespace, JoinGuest joins eth0 to the
// guest's device at layer 2 (idempotent, so a re-adopt after a restart runs it again), and
// the supervisor then has the agent give the guest's NIC the sandbox's address (control's
// network operation), so that the host side (filter, resolver, teardown) sees exactly what
// it sees for a namespace sandbox.
type GuestNetworker interface {
	NetNSer
	// JoinGuest joins eth0 of the network namespace ns (the one NetNS named) to the guest.
	JoinGuest(ns *os.File) error
}
