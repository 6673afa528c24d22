//go:build linux

package namespace

import (
	"fmt"
	"path/filepath"

	"github.com/bothy/bothy/runtime"
)

// NetNS implements runtime.NetNSer: the sandbox's init is the one process that Processes
// verifies as an init of dir (the child of dir's shim, PID 1 of a pid namespace of its own),
// and the runtime starts it in a network namespace of its own.
func (r *Runtime) NetNS(dir string) (int, error) {
	dir = filepath.Clean(dir)
	procs, err := r.Processes(filepath.Dir(dir))
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		if p.Role == runtime.RoleInit && p.Dir == dir {
			return p.ID.Pid, nil
		}
	}
	return 0, fmt.Errorf("namespace: the sandbox in %s has no live init", dir)
}
