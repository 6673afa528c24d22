// Package platform holds thin wrappers over the operating system, built on golang.org/x/sys:
// file locks, no-follow opens, directory handles and fsync, durable writes
// ([WriteFileDurableAt]), process identity ([ProcessID]: pid, start time and boot id, never
// a pid alone), pidfds, boot and machine ids, clocks, namespaces, mounts, loop devices,
// cgroups, capabilities, and the loading of a compiled seccomp program.
//
// It must not know about sandboxes, HTTP or records: it offers primitives with precise
// semantics and leaves policy to its callers (the stores, the supervisor, the runtime). It is a
// leaf that both sides of bothyd use, the sandbox side included, so it links no library
// beyond golang.org/x/sys: compiling a seccomp profile is the namespace runtime's host side.
// Linux code lives in _linux.go files, each with an _other.go twin that returns
// [ErrUnsupported], so that the module still builds (and its pure parts still test) on other
// systems.
package platform

import "errors"

// ErrUnsupported is returned by every primitive that this operating system cannot provide.
var ErrUnsupported = errors.New("platform: unsupported on this operating system (bothyd needs Linux)")
