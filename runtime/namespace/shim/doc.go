// Package shim is the sandbox side of the namespace runtime: the shim (the detached runtime
// process of a launch), the sandbox's init, which sets the sandbox up and becomes its agent
// ([agent.Run]) as PID 1, and the release of the sandbox's root after the shim has reported
// its end (release_linux.go): the hand-off to bothyd, served by [ServeReleases], or the
// releaser process where bothyd does not answer. Binaries run them through [Main]. It imports
// nothing of the host side (no store, supervisor or server package): what it shares with the
// host-side driver (package namespace) is the state directory's layout and [Config], declared
// here, and the runtime's own types in package runtime.
//
// It cannot compile a seccomp profile: the filter comes compiled, in [Config.Seccomp]. The
// process tree, the mounts and the privilege drop are described in package namespace.
package shim
