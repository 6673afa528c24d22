//go:build linux

package namespace

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// restart starts the stopped sandbox s again, as a new launch of the same spec, and waits
// until its agent answers (it returns that error, and the sandbox's log with it).
func (s *sandbox) restart(tb testing.TB, launch string) error {
	tb.Helper()
	if s.client != nil {
		s.client.Close()
		s.client = nil
	}
	s.spec.LaunchID = launch
	pid, err := s.rt.Start(context.Background(), s.spec)
	if err != nil {
		return err
	}
	s.id = pid
	return s.waitReady(15 * time.Second)
}

// TestPlantedLinksStayInside: root in a sandbox replaces directories that the init makes
// things in at the next start (/sys, where the cgroup is mounted, and /run, which holds
// /run/bothyd) with links to a host directory. The init, still host root before pivot_root,
// must not follow them out: nothing appears in the host directory, and the start either fails
// or succeeds with the links resolved inside the sandbox. Here the same path exists inside,
// so it succeeds, with the cgroup inside. Without RESOLVE_IN_ROOT the init made
// <host dir>/fs/cgroup and <host dir>/bothyd on the host.
func TestPlantedLinksStayInside(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	host, err := os.MkdirTemp("", "bothyd-planted-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(host) })
	s := startSandbox(t, rt, root, "planted", runtime.Resources{})
	if r := s.sh(t, "root", "mkdir -p "+host); r.Code != 0 {
		t.Fatalf("mkdir inside: %+v", r)
	}
	s.shutdown(t)
	s.waitShimGone(t)

	upper := filepath.Join(s.spec.Dir, shim.EntryUpper)
	for _, name := range []string{"sys", "run"} {
		if err := os.RemoveAll(filepath.Join(upper, name)); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(host, filepath.Join(upper, name)); err != nil {
			t.Fatal(err)
		}
	}
	startErr := s.restart(t, "launch-planted-2")
	ents, err := os.ReadDir(host)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("the start followed the sandbox's links onto the host: %s holds %v", host, ents)
	}
	if startErr != nil {
		t.Fatalf("the start failed: %v", startErr)
	}
	r := s.sh(t, "root", "ls "+host+"; ls /sys/fs/cgroup | head -n 3")
	if !strings.Contains(r.Output, "fs") || !strings.Contains(r.Output, "bothyd") {
		t.Fatalf("the links were not followed inside the sandbox: %+v", r)
	}
}

// TestDanglingPlantedLinkFailsCleanly: a planted link to a host directory that does not exist
// inside the sandbox makes the start fail, with nothing made on the host.
func TestDanglingPlantedLinkFailsCleanly(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	host, err := os.MkdirTemp("", "bothyd-planted-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(host) })
	s := startSandbox(t, rt, root, "dangling", runtime.Resources{})
	s.shutdown(t)
	s.waitShimGone(t)
	upper := filepath.Join(s.spec.Dir, shim.EntryUpper)
	if err := os.RemoveAll(filepath.Join(upper, "sys")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(upper, "sys")); err != nil {
		t.Fatal(err)
	}
	startErr := s.restart(t, "launch-dangling-2")
	if ents, err := os.ReadDir(host); err != nil || len(ents) != 0 {
		t.Fatalf("the start followed the sandbox's link onto the host: %s holds %v (%v)", host, ents, err)
	}
	if startErr == nil {
		t.Fatal("the start succeeded with /sys a link to nowhere inside")
	}
	s.waitShimGone(t)
	if o := s.outcome(t); o.Reason != runtime.ReasonExited && o.Reason != runtime.ReasonStartFailed {
		t.Fatalf("outcome %+v", o)
	}
}

// TestNoHostPathInside: nothing a sandbox can read names its state directory on the host:
// not the mount table (overlay options, bind sources), nor any process's command line.
func TestNoHostPathInside(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "paths", runtime.Resources{})
	r := s.sh(t, "root", "cat /proc/self/mountinfo /proc/1/mountinfo; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done")
	if r.Code != 0 || !strings.Contains(r.Output, " / / ") {
		t.Fatalf("reading the mount table: %+v", r)
	}
	for _, line := range strings.Split(r.Output, "\n") {
		if strings.Contains(line, root) {
			t.Errorf("the sandbox sees its host path %s: %s", root, line)
		}
	}
}

// TestControlDirectoryUnreachable: the host's control directory, where bothyd connects, is
// nowhere inside: root in the sandbox cannot rename, replace or add anything there, and what
// it writes to /run/bothyd stays in the sandbox.
func TestControlDirectoryUnreachable(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "ctl", runtime.Resources{})
	r := s.sh(t, "root", "ls -A /run/bothyd | wc -l; echo x > /run/bothyd/planted; echo rc=$?")
	if !strings.HasPrefix(r.Output, "0\n") {
		t.Fatalf("/run/bothyd inside is not empty: %+v", r)
	}
	ents, err := os.ReadDir(filepath.Join(s.spec.Dir, shim.EntryControl))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != shim.SocketName {
			t.Fatalf("a write inside landed in the host's control directory: %s", e.Name())
		}
	}
	// The agent still answers on the host's path.
	c, err := s.dial(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
