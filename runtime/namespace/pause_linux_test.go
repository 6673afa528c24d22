//go:build linux

package namespace

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/bothy/bothy/errcode"
)

// TestPauseOfAnEndedSandbox: a sandbox whose cgroup is gone (it ended between the caller's
// look and the freeze, and its shim removed the cgroup) cannot be paused, which is not-running,
// not a failure of the server; and thawing it has nothing left to do. Seen once in the chaos
// suite as a 500 ("read .../cgroup.procs: no such device") before the fix.
func TestPauseOfAnEndedSandbox(t *testing.T) {
	rt := newTestRuntime(t)
	if err := rt.PauseSupport(); err != nil {
		t.Skipf("no cgroup freezer here: %v", err)
	}
	dir := filepath.Join(newStateRoot(t), "sandboxes", "gone")
	ctx := context.Background()
	if err := rt.Freeze(ctx, "gone", dir); errcode.Of(err) != errcode.NotRunning {
		t.Fatalf("Freeze of a sandbox without a cgroup: %v; want not-running", err)
	}
	if err := rt.Thaw(ctx, "gone", dir); err != nil {
		t.Fatalf("Thaw of a sandbox without a cgroup: %v; want nothing to do", err)
	}
}
