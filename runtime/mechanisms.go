package runtime

// Mechanisms are the kernel mechanisms a runtime chose at start-up, from probes of the kernel
// it runs on, for the features that kernels give in more than one way: what /v1/info shows of
// the namespace runtime, so that an operator can tell a fallback from the best mechanism.
type Mechanisms struct {
	// Kernel is the running kernel's release (uname -r).
	Kernel string
	// OverlayLayers is how overlayfs is handed a sandbox's layers: "descriptors" (Linux
	// 6.13) or "paths" (/proc/self/fd/<n> of descriptors held, every kernel).
	OverlayLayers string
	// TmpfsOwnership is how a tmpfs layer gets the ids of a sandbox's user namespace:
	// "idmapped" (an idmapped mount, Linux 6.3) or "chowned" (owned by the host id of the
	// sandbox's root); "" without user namespaces.
	TmpfsOwnership string
	// UserNamespaces says sandboxes run in user namespaces of their own.
	UserNamespaces bool
	// Forced says the fallbacks were forced for a test, whatever the probes found.
	Forced bool
}

// MechanismReporter is a runtime that chose its [Mechanisms] at start-up.
type MechanismReporter interface {
	Mechanisms() Mechanisms
}
