//go:build !linux

package platform

import "time"

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

// BootID is unsupported off Linux.
func BootID() (string, error) { return "", ErrUnsupported }

// MachineID is unsupported off Linux.
func MachineID() (string, error) { return "", ErrUnsupported }

// Boottime is unsupported off Linux.
func Boottime() (time.Duration, error) { return 0, ErrUnsupported }

// Monotonic is unsupported off Linux.
func Monotonic() (time.Duration, error) { return 0, ErrUnsupported }
