//go:build linux

package namespace

import (
	"context"

	"github.com/sandboxd/sandboxd/platform"
	"github.com/sandboxd/sandboxd/runtime"
)

// The namespace runtime pauses a sandbox with the cgroup freezer of the sandbox's cgroup
// (platform.Cgroup.Freeze): cgroup.freeze on v2, the freezer hierarchy on v1.
var _ runtime.Pauser = (*Runtime)(nil)

// PauseSupport says why this host has no usable cgroup freezer.
func (r *Runtime) PauseSupport() error { return platform.FreezerSupport() }

// Freeze freezes every process of the sandbox's cgroup.
func (r *Runtime) Freeze(ctx context.Context, sandboxID, dir string) error {
	cg, err := platform.OpenCgroup(r.cgroupName(sandboxID, dir))
	if err != nil {
		return err
	}
	return cg.Freeze(ctx)
}

// Thaw thaws them.
func (r *Runtime) Thaw(ctx context.Context, sandboxID, dir string) error {
	cg, err := platform.OpenCgroup(r.cgroupName(sandboxID, dir))
	if err != nil {
		return err
	}
	return cg.Thaw(ctx)
}

// Frozen reports whether the sandbox's cgroup is frozen.
func (r *Runtime) Frozen(sandboxID, dir string) (bool, error) {
	cg, err := platform.OpenCgroup(r.cgroupName(sandboxID, dir))
	if err != nil {
		return false, err
	}
	return cg.Frozen()
}
