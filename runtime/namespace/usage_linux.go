//go:build linux

package namespace

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"

	"golang.org/x/sys/unix"
)

var _ runtime.Meter = (*Runtime)(nil)

// Usage reads the sandbox's cgroup (platform.Cgroup.Usage) and, for a sandbox with a disk of
// its own, what its disk image holds on the host: the image is sparse, so the blocks it holds
// are what the writable layer and its file system's metadata wrote, against the image's size.
// Blocks freed inside are given back only when the file system discards them, so the figure
// is what the disk costs the host, an upper bound of what the layer holds now.
func (r *Runtime) Usage(sandboxID, dir string) (runtime.Usage, error) {
	var u runtime.Usage
	cg, err := platform.OpenCgroup(r.cgroupName(sandboxID, dir))
	if err != nil {
		return u, err
	}
	if u.CgroupUsage, err = cg.Usage(); err != nil {
		if cgroupGone(err) {
			return u, fs.ErrNotExist
		}
		return u, err
	}
	var st unix.Stat_t
	err = unix.Lstat(filepath.Join(dir, shim.EntryDiskImage), &st)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		u.HasDisk, u.DiskUsedBytes, u.DiskLimitBytes = true, st.Blocks*512, st.Size
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return u, err
	}
	return u, nil
}
