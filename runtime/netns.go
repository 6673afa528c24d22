package runtime

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
