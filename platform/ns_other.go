//go:build !linux

package platform

import "syscall"

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

// SetHostname is unsupported off Linux.
func SetHostname(name string) error { return ErrUnsupported }

// LoopbackUp is unsupported off Linux.
func LoopbackUp() error { return ErrUnsupported }

// SetParentDeathSignal is unsupported off Linux.
func SetParentDeathSignal(sig syscall.Signal) error { return ErrUnsupported }

// UnshareCgroupNamespace is unsupported off Linux.
func UnshareCgroupNamespace() (bool, error) { return false, ErrUnsupported }
