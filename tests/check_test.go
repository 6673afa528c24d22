package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/runtime/namespace/shim"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// checkReport is the part of `bothyd check --json` the tests look at.
type checkReport struct {
	Sandboxes int            `json:"sandboxes"`
	Running   int            `json:"running"`
	Paused    int            `json:"paused"`
	Spares    int            `json:"spares"`
	Processes int            `json:"processes"`
	Trash     int            `json:"trash"`
	Problems  []checkProblem `json:"problems"`
	Notes     []checkProblem `json:"notes"`
	Remaining int            `json:"remaining"`
	OK        bool           `json:"ok"`
}

type checkProblem struct {
	Kind     string `json:"kind"`
	Sandbox  string `json:"sandbox"`
	Entry    string `json:"entry"`
	Detail   string `json:"detail"`
	Repaired bool   `json:"repaired"`
}

// runCheck runs the built `bothyd check --json` on root and returns its report and exit
// status.
func runCheck(t testing.TB, root string, extra ...string) (checkReport, int, string) {
	t.Helper()
	return runCheckIn(t, nil, root, extra...)
}

// runCheckIn is runCheck inside the network namespace ns (nil: the test's own), where the
// server of root runs: the checker judges, and with --repair removes, the network resources
// of the namespace it runs in.
func runCheckIn(t testing.TB, ns *os.File, root string, extra ...string) (checkReport, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bothydBin, append([]string{"check", "--root", root, "--json"}, extra...)...)
	var stdout bytes.Buffer
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := startIn(ns, cmd)
	if err == nil {
		err = cmd.Wait()
	}
	out := stdout.Bytes()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("bothyd check: %v", err)
	}
	var r checkReport
	if code != 2 {
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("bothyd check --json printed %q (stderr %s): %v", out, stderr.String(), err)
		}
	}
	return r, code, stderr.String()
}

// mustCheckClean runs the checker and fails the test, printing the report, unless it passes.
func mustCheckClean(t testing.TB, root, when string) checkReport {
	t.Helper()
	return mustCheckCleanIn(t, nil, root, when)
}

// mustCheckCleanIn is mustCheckClean inside the network namespace ns (runCheckIn).
func mustCheckCleanIn(t testing.TB, ns *os.File, root, when string) checkReport {
	t.Helper()
	r, code, stderr := runCheckIn(t, ns, root)
	if code != 0 || !r.OK {
		b, _ := json.MarshalIndent(r, "", "  ")
		t.Fatalf("%s: bothyd check exited %d:\n%s\n%s", when, code, b, stderr)
	}
	return r
}

func (r checkReport) kinds() map[string][]string {
	m := map[string][]string{}
	for _, p := range r.Problems {
		m[p.Kind] = append(m[p.Kind], p.Sandbox)
	}
	return m
}

func TestCheckUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
		want int
	}{
		{"unknown flag", []string{"check", "--frobnicate"}, 2},
		{"extra argument", []string{"check", "--root", t.TempDir(), "extra"}, 2},
		{"missing root", []string{"check", "--root", filepath.Join(t.TempDir(), "nope")}, 2},
		{"help", []string{"check", "-h"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(bothydBin, c.args...)
			out, err := cmd.CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			if code != c.want {
				t.Fatalf("exit %d, want %d: %s", code, c.want, out)
			}
		})
	}
}

// TestCheckCleanBesideServer: a state root in use passes, offline and beside the server,
// while sandboxes start, run execs and stop; no transition is ever taken for a problem.
func TestCheckCleanBesideServer(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("ckrun", true)
	d.create("ckidle", false)
	d.create("ckflip", false)
	r := mustCheckClean(t, d.Root, "beside the server")
	if r.Sandboxes != 3 || r.Running != 1 || r.Processes != 2 {
		t.Fatalf("report counts %+v, want 3 sandboxes, 1 running, 2 processes (shim and init)", r)
	}

	// Transitions beside the checker: starts, execs and stops of one sandbox.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			d.doJSON("POST", "/v1/sandboxes/ckflip/start", nil)
			d.doJSON("POST", "/v1/sandboxes/ckflip/exec", map[string]any{"command": []string{"true"}})
			d.doJSON("POST", fmt.Sprintf("/v1/sandboxes/ckflip/stop?force=%v", i%2 == 0), nil)
		}
	}()
	for range 8 {
		r, code, stderr := runCheck(t, d.Root)
		if code != 0 {
			close(done)
			wg.Wait()
			t.Fatalf("beside transitions, check exited %d: %+v %s", code, r, stderr)
		}
	}
	close(done)
	wg.Wait()
	d.Stop()
	mustCheckClean(t, d.Root, "offline")
	d.start() // for the harness's clean-up
}

// TestCheckJudgesRuntimeAsServer: `bothyd check` makes its runtime as the server does
// (here: bothyd-runtime beside bothyd), so a sandbox the server runs is no runtime
// mismatch; given another runtime binary (--runtime-binary, bothyd itself), it notes one.
// Without the shared choice, the checker run from bothyd always used bothyd itself and
// noted every running sandbox of a server using bothyd-runtime as a mismatch.
func TestCheckJudgesRuntimeAsServer(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("ckrt", true)
	mismatches := func(r checkReport) []string {
		var ids []string
		for _, n := range r.Notes {
			if n.Kind == "runtime-mismatch" {
				ids = append(ids, n.Sandbox)
			}
		}
		return ids
	}
	r := mustCheckClean(t, d.Root, "beside the server")
	if r.Running != 1 {
		t.Fatalf("report counts %+v, want 1 running", r)
	}
	if m := mismatches(r); len(m) != 0 {
		t.Errorf("the checker takes the server's sandboxes %v for ones of another runtime: %+v", m, r.Notes)
	}
	r, code, stderr := runCheck(t, d.Root, "--runtime-binary", bothydBin)
	if code != 0 {
		t.Fatalf("check --runtime-binary %s exited %d: %+v %s", bothydBin, code, r, stderr)
	}
	if m := mismatches(r); len(m) != 1 || m[0] != "ckrt" {
		t.Errorf("with another runtime binary, the checker notes runtime mismatches %v, want [ckrt]: %+v", m, r.Notes)
	}
}

// TestCheckFindsAndRepairs damages a state root in every way the checker knows and checks
// that it finds each, repairs what is safe to repair, and leaves the rest (and every sandbox)
// alone.
func TestCheckFindsAndRepairs(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("stale", true)    // its shim is killed while the server is down
	d.create("orphan", true)   // its runtime record is removed: its processes are unrecorded
	d.create("journal", false) // gets a launch journal of a launch that never committed
	d.create("foreign", false) // gets a foreign file, and a binding to a lease that does not exist
	d.Kill()

	rt, err := namespace.New(namespace.Config{})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := rt.Processes(d.Root)
	if err != nil {
		t.Fatal(err)
	}
	sbx := filepath.Join(d.Root, store.SandboxesDir)
	for _, p := range procs {
		if p.Role == "shim" && p.Dir == filepath.Join(sbx, "stale") {
			if err := platform.SignalVerified(p.ID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := platform.WaitExit(ctx, p.ID); err != nil {
				t.Fatal(err)
			}
			cancel()
		}
	}
	if err := os.Remove(filepath.Join(sbx, "orphan", store.RuntimeName)); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(d.Root)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := st.LockExisting(ctx, "journal")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteLaunchJournal(&store.LaunchJournal{Format: store.LaunchFormat, LaunchID: "0123456789abcdef", RuntimeID: rt.Identity(), StartedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := os.WriteFile(filepath.Join(sbx, "foreign", "junk"), []byte("not ours"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(sbx, "leftover"), 0o700); err != nil {
		t.Fatal(err)
	}
	// The cgroup of a sandbox of this root that is gone.
	gone, err := platform.OpenCgroup(d.cgroupName("gone"))
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Create(platform.CgroupLimits{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gone.Remove(context.Background()) })
	// With the children a running sandbox's cgroup has with a pids limit (cgroup v1: the
	// workloads' pids child; v2: agent and workloads), which repair removes with it.
	if gone.V2() {
		f, err := gone.SplitV2(-1)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	} else {
		child, self, err := gone.PidsChild(shim.WorkloadCgroup, 2)
		if err != nil {
			t.Fatal(err)
		}
		child.Close()
		self.Close()
	}
	// The runtime processes' leaf beside the sandboxes' cgroups (runtime.SpawnDetached, cgroup
	// v2; made here on v1 too, empty) is no sandbox's: neither reported nor removed.
	leaf, err := platform.OpenCgroup("bothy/" + runtime.RuntimeCgroup)
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.Create(platform.CgroupLimits{}); err != nil {
		t.Fatal(err)
	}
	if !leaf.V2() {
		t.Cleanup(func() {
			for _, dir := range leaf.Dirs() {
				_ = os.Remove(dir) // refused while it holds processes
			}
		})
	}

	// The template store: a lease whose clone has no binding (repairable), and a binding that
	// names a lease that does not exist (not repairable: it is a bug to report).
	ts, err := template.Open(d.Root, template.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.CreateTemplate(ctx, "tpl"); err != nil {
		t.Fatal(err)
	}
	layer := t.TempDir()
	if err := os.WriteFile(filepath.Join(layer, "file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := ts.Capture(ctx, "tpl", layer, template.Key{Runtime: rt.Identity(), Image: "host"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := ts.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.WriteLease("tpl", g.ID, "ghost"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Unlock(); err != nil {
		t.Fatal(err)
	}
	// A second generation whose payload is gone: indexed, and nothing to clone from.
	g2, err := ts.Capture(ctx, "tpl", layer, template.Key{Runtime: rt.Identity(), Image: "host"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(d.Root, template.TemplatesDir, "tpl", g2.ID, template.PayloadDir)); err != nil {
		t.Fatal(err)
	}
	ts.Close()
	// A host mount inside a state directory (the runtime mounts only in sandboxes' own
	// namespaces, so this is a leak).
	leak := filepath.Join(sbx, "stale", "rootfs")
	if err := platform.Mount("tmpfs", leak, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { platform.UnmountUnder(leak) })
	if err := template.WriteBinding(filepath.Join(sbx, "foreign"), &template.Binding{Template: "tpl", Generation: g.ID, Lease: "l-00000000000000ff", AcquiredAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}

	// A loop device holding the disk image of a sandbox that does not run (here: held by this
	// test's descriptor; in life, by a mount somewhere). Not repairable: it is reported.
	var loop *os.File
	if _, err := os.Stat(platform.LoopControl); err == nil {
		img := filepath.Join(sbx, "journal", "disk.img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 1<<20); err != nil {
			t.Fatal(err)
		}
		if loop, err = platform.AttachLoop(img); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { loop.Close() })
	}

	want := map[string][]string{
		"stale-runtime-record":  {"stale"},
		"leaked-cgroup":         {"gone", "orphan", "stale"}, // the orphan's is used by unrecorded processes
		"unrecorded-process":    {"orphan", "orphan"},        // its shim and its init
		"interrupted-start":     {"journal"},
		"foreign-entry":         {"foreign"},
		"leftover-directory":    {"leftover"},
		"binding-without-lease": {"foreign"},
		"lease-without-binding": {"ghost"},
		"index-without-payload": {""},
		"leaked-mount":          {"stale"},
	}
	if loop != nil {
		want["leaked-loop"] = []string{"journal"}
	}
	r, code, stderr := runCheck(t, d.Root)
	if code != 1 || r.OK {
		t.Fatalf("check of a damaged root exited %d (ok %v): %+v %s", code, r.OK, r, stderr)
	}
	got := r.kinds()
	for k := range got {
		slices.Sort(got[k])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("check found %v\nwant %v\nreport %+v", got, want, r)
	}

	r, code, stderr = runCheck(t, d.Root, "--repair")
	if code != 1 {
		t.Fatalf("repair exited %d, want 1 (a foreign file and a binding without lease are not ours to fix): %+v %s", code, r, stderr)
	}
	for _, p := range r.Problems {
		wantRepaired := p.Kind != "foreign-entry" && p.Kind != "binding-without-lease" && p.Kind != "leaked-loop"
		if p.Repaired != wantRepaired {
			t.Errorf("%s of %s: repaired %v, want %v", p.Kind, p.Sandbox, p.Repaired, wantRepaired)
		}
	}
	if n := runtimeProcesses(t, d.Root); len(n) != 0 {
		t.Fatalf("runtime processes left after repair: %v", n)
	}
	if loop != nil {
		loop.Close() // what held it lets go; the device clears itself
		waitFor(t, 10*time.Second, "the loop device to clear", func() bool { return d.attachedImages()["journal"] == 0 })
	}
	r, code, _ = runCheck(t, d.Root)
	if got := r.kinds(); code != 1 || len(got) != 2 || len(got["foreign-entry"]) != 1 || len(got["binding-without-lease"]) != 1 {
		t.Fatalf("after repair, check exited %d and found %v", code, got)
	}
	if points, _ := platform.MountsUnder(leak); len(points) != 0 {
		t.Errorf("repair left the leaked mount %v", points)
	}
	if gone.Exists() {
		t.Errorf("repair left the cgroup of a sandbox that is gone")
	}
	if !leaf.Exists() {
		t.Errorf("repair removed the runtime processes' cgroup %s", leaf.Name())
	}
	if _, err := os.Lstat(filepath.Join(sbx, "foreign", "junk")); err != nil {
		t.Fatalf("repair touched a foreign file: %v", err)
	}

	// Every sandbox is still there, and usable.
	d.start()
	for _, id := range []string{"stale", "orphan", "journal", "foreign"} {
		sb := decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/"+id, nil, nil), 200)
		if sb.State == "running" {
			t.Fatalf("%s reads as running after repair", id)
		}
	}
	if r := d.doJSON("POST", "/v1/sandboxes/orphan/start", nil); r.Status != 200 {
		t.Fatalf("starting the repaired orphan: %d %s", r.Status, r.Body)
	}
	if got := d.exec("orphan", map[string]any{"command": []string{"true"}}); got.ExitCode != 0 {
		t.Fatalf("exec in the repaired orphan: %+v", got)
	}
	// Clean up what the harness cannot: the foreign file and the dangling binding.
	os.Remove(filepath.Join(sbx, "foreign", "junk"))
	template.RemoveBinding(filepath.Join(sbx, "foreign"))
}

// TestSameIDInTwoStateRoots: two servers on one host, each with its own state root, may both
// have a sandbox of the same id; stopping one must not touch the other. The namespace runtime
// names cgroups <parent>/<id> without the state root, so both sandboxes share one cgroup.
func TestSameIDInTwoStateRoots(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	a, b := startDaemon(t), startDaemon(t)
	id := fmt.Sprintf("twin%04x", uint16(time.Now().UnixNano()))
	a.create(id, true)
	b.create(id, true)
	if r := a.doJSON("POST", "/v1/sandboxes/"+id+"/stop", nil); r.Status != 200 {
		t.Fatalf("stopping the first: %d %s", r.Status, r.Body)
	}
	sb := decode[sandboxJSON](t, b.do("GET", "/v1/sandboxes/"+id, nil, nil), 200)
	if sb.State != "running" {
		t.Fatalf("stopping %s in one state root ended its namesake in another: %+v", id, sb)
	}
	if r := b.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"true"}}); r.Status != 200 {
		t.Fatalf("exec in the second after the first stopped: %d %s", r.Status, r.Body)
	}
}

// testCgroupParent is a cgroup parent of the test's own, other than bothyd's default, removed
// (with whatever is left below it) once the test and its daemons are done.
func testCgroupParent(t *testing.T, tag string) string {
	t.Helper()
	name := fmt.Sprintf("bothy-test-%d-%s", os.Getpid(), tag)
	t.Cleanup(func() {
		cg, err := platform.OpenCgroup(name)
		if err != nil {
			t.Errorf("the test's cgroup parent %s: %v", name, err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cg.Remove(ctx); err != nil {
			t.Errorf("removing the test's cgroup parent %s: %v", name, err)
		}
	})
	return name
}

// wantSandboxCgroup fails the test unless the cgroup of the sandbox id of d lies below parent:
// the sandbox's limits really are where the test's cgroup parent says.
func wantSandboxCgroup(t *testing.T, d *daemon, parent, id string) {
	t.Helper()
	cg, err := platform.OpenCgroup(parent + "/" + shim.CgroupLeaf(id, filepath.Join(d.Root, store.SandboxesDir, id)))
	if err != nil {
		t.Fatal(err)
	}
	if !cg.Exists() {
		t.Fatalf("the cgroup of sandbox %s is not below the cgroup parent %s (%v)", id, parent, cg.Dirs())
	}
}

// recordedCgroupParent is the cgroup parent that the state root records (<root>/cgroup.json).
func recordedCgroupParent(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "cgroup.json"))
	if err != nil {
		t.Fatalf("the state root's record of its cgroup parent: %v", err)
	}
	var r struct {
		Parent string `json:"parent"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("cgroup.json %q: %v", b, err)
	}
	return r.Parent
}

// TestCheckFindsRecordedCgroupParent: `bothyd check --root R`, typed without --cgroup-parent
// and BOTHY_CGROUP_PARENT, judges a root whose server runs with another cgroup parent (as the
// packages' unit does) consistent, beside the server and offline: the server records its
// parent in the root and the checker takes it from there. Before the record, the checker
// looked below the default parent and took the running sandbox for a bad record.
func TestCheckFindsRecordedCgroupParent(t *testing.T) {
	requireRoot(t)
	if os.Getenv("BOTHY_CGROUP_PARENT") != "" {
		t.Skip("BOTHY_CGROUP_PARENT is set: this test runs the checker without it")
	}
	t.Parallel()
	parent := testCgroupParent(t, "check")
	d := startDaemon(t, withArgs("--cgroup-parent", parent))
	d.create("ckparent", true)
	wantSandboxCgroup(t, d, parent, "ckparent")
	// Paused, as spares are: the pause is judged from the sandbox's cgroup's freezer, which
	// the checker read below the default parent and, not finding it, took the pause record
	// for a bad record (what the guest suite saw after a reboot, with the packages' unit).
	d.create("ckpaused", true)
	d.mustStatus(200, "POST", "/v1/sandboxes/ckpaused/pause", nil)
	r := mustCheckClean(t, d.Root, "beside a server with --cgroup-parent, checked without it")
	if r.Running != 2 || r.Paused != 1 {
		t.Fatalf("report counts %+v, want 2 running, 1 paused", r)
	}
	if got := recordedCgroupParent(t, d.Root); got != parent {
		t.Fatalf("the state root records the cgroup parent %q, want %q", got, parent)
	}
	d.Stop()
	r = mustCheckClean(t, d.Root, "offline, checked without --cgroup-parent")
	if r.Running != 2 || r.Paused != 1 {
		t.Fatalf("offline report counts %+v, want 2 running, 1 paused", r)
	}
	// Given explicitly, the flag wins over the record: below the default parent there is no
	// cgroup of the paused sandbox, so its pause is a problem (on v1 a freezer not frozen, on
	// v2 one that does not read).
	r, code, stderr := runCheck(t, d.Root, "--cgroup-parent", "bothy")
	if code != 1 || !slices.ContainsFunc(r.Problems, func(p checkProblem) bool { return p.Sandbox == "ckpaused" }) {
		t.Errorf("check --cgroup-parent bothy exited %d, want 1 with a problem of ckpaused, whose cgroup is below %s: %+v %s", code, parent, r, stderr)
	}
	d.start() // for the sandbox's clean-up
}

// TestCgroupParentChangeRefused: a server given a cgroup parent other than the one its state
// root records refuses to start while sandboxes' cgroups remain below the recorded one (it
// would orphan them), naming both; a server given none takes the recorded one and reattaches
// the sandbox; once no sandbox runs, the new parent is taken and recorded.
func TestCgroupParentChangeRefused(t *testing.T) {
	requireRoot(t)
	if os.Getenv("BOTHY_CGROUP_PARENT") != "" {
		t.Skip("BOTHY_CGROUP_PARENT is set: this test starts bothyd without it")
	}
	t.Parallel()
	first, second := testCgroupParent(t, "first"), testCgroupParent(t, "second")
	d := startDaemon(t, withArgs("--cgroup-parent", first))
	d.create("ckmove", true)
	wantSandboxCgroup(t, d, first, "ckmove")
	d.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bothydBin, "--listen", "127.0.0.1:0", "--root", d.Root, "--spares", "0", "--cgroup-parent", second)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("bothyd --cgroup-parent %s with a sandbox running below %s: %v, want exit status 1: %s", second, first, err, out)
	}
	if !strings.Contains(string(out), "--cgroup-parent "+first) || !strings.Contains(string(out), "--cgroup-parent "+second) {
		t.Errorf("the refusal does not name both parents (%s, %s): %s", first, second, out)
	}
	if got := recordedCgroupParent(t, d.Root); got != first {
		t.Fatalf("after the refusal the state root records %q, want %q", got, first)
	}

	// Without the flag: the recorded parent, so the sandbox is found again and driven.
	d.Args = nil
	d.start()
	if sb := decode[sandboxJSON](t, d.doJSON("GET", "/v1/sandboxes/ckmove", nil), 200); sb.State != "running" {
		t.Fatalf("a server without --cgroup-parent reattached the sandbox as %q, want running", sb.State)
	}
	d.execTrue("ckmove")
	d.dispose("ckmove")
	d.Stop()

	// No sandbox runs below the first parent any more: the second is taken and recorded.
	d.Args = []string{"--cgroup-parent", second}
	d.start()
	if got := recordedCgroupParent(t, d.Root); got != second {
		t.Fatalf("with no sandbox left below %s, the state root records %q, want %q", first, got, second)
	}
	d.create("ckmoved", true)
	wantSandboxCgroup(t, d, second, "ckmoved")
	mustCheckClean(t, d.Root, "after the move, checked without --cgroup-parent")
}
