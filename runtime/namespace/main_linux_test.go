//go:build linux

package namespace

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// testCgroupParent keeps the tests' cgroups apart from a real bothyd's.
const testCgroupParent = "bothyd-test"

// TestMain dispatches the hidden sub-commands, as cmd/bothyd does, so that the runtime
// re-executes this test binary as shim and init; then it runs the tests and checks that
// nothing was left behind.
func TestMain(m *testing.M) {
	if code, ran := shim.Main(os.Args[1:]); ran {
		os.Exit(code)
	}
	code := m.Run()
	if code == 0 && os.Geteuid() == 0 {
		if err := checkNoLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "leak check:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testRoots are the state roots the tests made, for the leak check.
var testRoots []string

// checkNoLeaks checks that no runtime process, cgroup or mount of the tests remains.
func checkNoLeaks() error {
	rt := &Runtime{cfg: Config{Executable: "/proc/self/exe", CgroupParent: testCgroupParent}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var problems []string
		for _, root := range testRoots {
			procs, err := rt.Processes(root)
			if err != nil {
				return err
			}
			for _, p := range procs {
				problems = append(problems, fmt.Sprintf("%s %s of %s still runs", p.Role, p.ID, p.Dir))
			}
			mounts, err := platform.MountsUnder(root)
			if err != nil {
				return err
			}
			for _, m := range mounts {
				problems = append(problems, "mount left on the host: "+m)
			}
		}
		if cg, err := platform.OpenCgroup(testCgroupParent); err == nil {
			for _, d := range cg.Dirs() {
				ents, _ := os.ReadDir(d)
				for _, e := range ents {
					// The runtime processes' leaf (cgroup v2) is no sandbox's; with every
					// runtime process gone it is empty, and goes.
					if e.IsDir() && e.Name() == runtime.RuntimeCgroup {
						if err := os.Remove(filepath.Join(d, e.Name())); err == nil {
							continue
						}
					}
					if e.IsDir() {
						problems = append(problems, "cgroup left: "+filepath.Join(d, e.Name()))
					}
				}
			}
			for _, d := range cg.Dirs() {
				_ = os.Remove(d)
			}
		}
		if len(problems) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s", strings.Join(problems, "; "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitGone waits until id no longer runs or ctx ends.
func waitGone(ctx context.Context, id platform.ProcessID) error {
	return platform.WaitExit(ctx, id)
}
