//go:build !linux

package platform

import "context"

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

// FreezerSupport is unsupported off Linux.
func FreezerSupport() error { return ErrUnsupported }

func (c *Cgroup) Frozen() (bool, error)            { return false, ErrUnsupported }
func (c *Cgroup) Freeze(ctx context.Context) error { return ErrUnsupported }
func (c *Cgroup) Thaw(ctx context.Context) error   { return ErrUnsupported }
