package check

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// A server may run sandboxes under several runtimes (Options.Runtime, the default, and
// Options.Runtimes). The checker lists the processes and host resources of all of them, and
// ends a process through the runtime that found it.

// runtimes returns every runtime of the server, the default first.
func (c *checker) runtimes() []runtime.Runtime {
	return append([]runtime.Runtime{c.o.Runtime}, c.o.Runtimes...)
}

// runtimeOf is the runtime of kind ("" is the default's), nil when the server has none.
func (c *checker) runtimeOf(kind string) runtime.Runtime {
	if kind == "" {
		return c.o.Runtime
	}
	for _, rt := range c.runtimes() {
		if rt.Kind() == kind {
			return rt
		}
	}
	return nil
}

// identityOf is the identity of the runtime of kind, "" when the server has none.
func (c *checker) identityOf(kind string) string {
	if rt := c.runtimeOf(kind); rt != nil {
		return rt.Identity()
	}
	return ""
}

// sandboxRuntime is the runtime of the sandbox's live launch (by its record), else the
// default.
func (c *checker) sandboxRuntime(s *sandboxState) runtime.Runtime {
	if s.rec != nil {
		if rt := c.runtimeOf(s.rec.RuntimeKind); rt != nil {
			return rt
		}
	}
	return c.o.Runtime
}

// listProcesses lists the runtime processes of every runtime into p, and remembers which
// runtime found each.
func (c *checker) listProcesses(p *pass) error {
	c.owners = map[platform.ProcessID]runtime.Runtime{}
	for _, rt := range c.runtimes() {
		procs, err := rt.Processes(c.root)
		if err != nil {
			return fmt.Errorf("check: list the %s runtime's processes: %w", rt.Kind(), err)
		}
		for _, pr := range procs {
			c.owners[pr.ID] = rt
		}
		p.procs = append(p.procs, procs...)
	}
	return nil
}

// ownerOf is the runtime that listed pr.
func (c *checker) ownerOf(pr runtime.Process) runtime.Runtime {
	if rt := c.owners[pr.ID]; rt != nil {
		return rt
	}
	return c.o.Runtime
}

// hostResources lists what every runtime holds on the host for this root's sandboxes.
func (c *checker) hostResources() ([]runtime.HostResource, error) {
	var out []runtime.HostResource
	for _, rt := range c.runtimes() {
		found, err := rt.HostResources(filepath.Join(c.root, store.SandboxesDir))
		if err != nil {
			return nil, err
		}
		out = append(out, found...)
	}
	return out, nil
}

// cleanupAll releases what any runtime may have left of the sandbox in dir, which runs no
// launch.
func (c *checker) cleanupAll(ctx context.Context, id, dir string) error {
	var errs []error
	for _, rt := range c.runtimes() {
		if err := rt.Cleanup(ctx, id, dir, platform.ProcessID{}); err != nil {
			errs = append(errs, fmt.Errorf("%s runtime: %w", rt.Kind(), err))
		}
	}
	return errors.Join(errs...)
}
