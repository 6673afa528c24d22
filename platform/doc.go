// Package platform holds thin wrappers over the operating system, built on golang.org/x/sys:
// file locks, no-follow opens, directory handles and fsync, durable writes, process identity,
// boot and machine ids, clocks, namespaces, mounts and cgroups.
//
// It must not know about sandboxes, HTTP or records: it offers primitives with precise
// semantics and leaves policy to store/ and supervisor/. Linux code lives in _linux.go files,
// each with an _other.go twin that returns ErrUnsupported, so that the module still builds
// (and its pure parts still test) on other systems.
package platform

import "errors"

// ErrUnsupported is returned by every primitive that this operating system cannot provide.
var ErrUnsupported = errors.New("platform: unsupported on this operating system (sandboxd needs Linux)")
