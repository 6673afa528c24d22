//go:build linux

package namespace

import (
	"context"
	"errors"
	"io/fs"
	"syscall"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// The namespace runtime pauses a sandbox with the cgroup freezer of the sandbox's cgroup
// (platform.Cgroup.Freeze): cgroup.freeze on v2, the freezer hierarchy on v1.
var _ runtime.Pauser = (*Runtime)(nil)

// PauseSupport says why this host has no usable cgroup freezer.
func (r *Runtime) PauseSupport() error { return platform.FreezerSupport() }

// Freeze freezes every process of the sandbox's cgroup.
func (r *Runtime) Freeze(ctx context.Context, sandboxID, dir string) error {
	cg, err := platform.OpenCgroup(r.cgroupName(sandboxID, dir))
	switch {
	case err != nil:
	case !cg.Exists():
		err = fs.ErrNotExist // nothing to freeze: no freezer cgroup may be made for it
	default:
		err = cg.Freeze(ctx)
	}
	if cgroupGone(err) {
		// The sandbox ended between the caller's look and the freeze: its shim removed the
		// cgroup. That is a sandbox that does not run, not a failure of the server.
		return errcode.Wrap(errcode.NotRunning, err, "Sandbox %s ended as it was being paused.", sandboxID)
	}
	return err
}

// cgroupGone says whether err is a cgroup that no longer exists: its directory is gone
// (ENOENT), or it was removed under an open file of it (ENODEV).
func cgroupGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV)
}

// Thaw thaws them.
func (r *Runtime) Thaw(ctx context.Context, sandboxID, dir string) error {
	cg, err := platform.OpenCgroup(r.cgroupName(sandboxID, dir))
	if err == nil {
		err = cg.Thaw(ctx)
	}
	if cgroupGone(err) {
		return nil // an ended sandbox has nothing frozen left
	}
	return err
}

// Frozen reports whether the sandbox's cgroup is frozen.
func (r *Runtime) Frozen(sandboxID, dir string) (bool, error) {
	cg, err := platform.OpenCgroup(r.cgroupName(sandboxID, dir))
	if err != nil {
		return false, err
	}
	return cg.Frozen()
}
