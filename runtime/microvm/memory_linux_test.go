//go:build linux

package microvm

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

// counterScript runs a shell loop, detached, that counts in memory and writes each count to
// /dev/shm/count (a tmpfs: only the VM's memory holds it) and its pid to /dev/shm/pid. Each
// count is renamed into place: a reader of a file rewritten in place could find it empty.
const counterScript = `setsid sh -c 'echo $$ > /dev/shm/pid; i=0; while :; do i=$((i+1)); echo $i > /dev/shm/count.new; mv -f /dev/shm/count.new /dev/shm/count; sleep 0.2; done' </dev/null >/dev/null 2>&1 &`

// TestSaveAndRestore starts a counter in a microVM, saves the stopped VM's memory with its
// disk (Freeze, OpenLiveLayer, Thaw), and restores the state into a second VM under a new
// capability and host name: the counter's process runs on there, with its pid, counting on
// from where it was, and the guest's identity (host name, machine id) is the new launch's.
func TestSaveAndRestore(t *testing.T) {
	r := newRuntime(t)
	ctx := vmContext(t)
	spec := testSpec(t, "src")
	proc, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Kill(ctx, spec.Dir, proc) }()
	c := dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability)
	defer c.Close()
	run(ctx, t, c, "sh", "-c", counterScript)
	pid := waitCount(ctx, t, c, 2)
	srcMachine := strings.TrimSpace(run(ctx, t, c, "cat", "/etc/machine-id"))

	t0 := time.Now()
	if err := r.Freeze(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	if frozen, err := r.Frozen(spec.ID, spec.Dir); err != nil || !frozen {
		t.Fatalf("Frozen after Freeze: %v, %v", frozen, err)
	}
	layer, snapshot, err := r.OpenLiveLayer(ctx, spec.ID, spec.Dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer layer.Close()
	if err := r.Thaw(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("save pause (stop, migrate to a file, copy the overlay, cont) of a 256 MiB guest: %v", time.Since(t0))
	if !snapshot {
		t.Fatal("the live layer of a microVM is not a snapshot")
	}
	if frozen, err := r.Frozen(spec.ID, spec.Dir); err != nil || frozen {
		t.Fatalf("Frozen after Thaw: %v, %v", frozen, err)
	}
	_, atSave := readCount(ctx, t, c)
	// The source runs on after its save.
	waitCount(ctx, t, c, atSave+2)

	gen := filepath.Join(t.TempDir(), "payload")
	copyDir(t, layer, gen)
	clone := testSpec(t, "clone")
	clone.Lowers = []string{gen}
	clone.Capability = []byte("secret-of-the-clone")
	// The supervisor's advance is the downtime since the capture; an hour more shows it is
	// applied.
	clone.Restore = &runtime.Restore{ClockAdvance: time.Since(t0) + time.Hour}
	t1 := time.Now()
	cproc, err := r.Start(ctx, clone)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Kill(ctx, clone.Dir, cproc) }()
	cc := dialAgent(ctx, t, r, clone.Dir, cproc, clone.Capability)
	defer cc.Close()
	t.Logf("restore of a 256 MiB guest to the first answer: %v", time.Since(t1))
	cpid, first := readCount(ctx, t, cc)
	if cpid != pid {
		t.Fatalf("the clone's counter runs as pid %d, the source's as %d", cpid, pid)
	}
	if first < atSave-1 {
		t.Fatalf("the clone's count %d is before the count at the save, %d", first, atSave)
	}
	waitCount(ctx, t, cc, first+2)
	if h := strings.TrimSpace(run(ctx, t, cc, "hostname")); h != clone.ID {
		t.Fatalf("the clone's host name is %q, want %q", h, clone.ID)
	}
	if m := strings.TrimSpace(run(ctx, t, cc, "cat", "/etc/machine-id")); len(m) != 32 || m == srcMachine {
		t.Fatalf("the clone's machine id %q (the source's %q)", m, srcMachine)
	}
	wantClock(ctx, t, cc, time.Hour)
	// The old capability does not open the clone.
	if conn, err := platform.DialUnixNoFollow(ctx, r.ControlPath(clone.Dir)); err == nil {
		if old, err := control.Dial(conn, spec.Capability, 30*time.Second); err == nil {
			old.Close()
			t.Fatal("the clone accepted the source's capability")
		}
	}
}

// wantClock fails unless the guest's clock reads the host's plus ahead, within clockSlack
// and half the round trip of the exec that read it. The guest's clock is set from the
// host's at boot and advanced over every stop, so what stays is the lag of a frame and of
// a stop's QMP command: a clock left behind by a save (hundreds of milliseconds for 256 MiB
// under TCG, seconds on a busy host) does not pass.
func wantClock(ctx context.Context, t *testing.T, c *control.Client, ahead time.Duration) {
	t.Helper()
	before := time.Now()
	out := strings.TrimSpace(run(ctx, t, c, "date", "+%s.%N"))
	after := time.Now()
	secs, err := strconv.ParseFloat(out, 64)
	if err != nil {
		t.Fatalf("date in the guest: %q", out)
	}
	guest := time.Unix(0, int64(secs*1e9))
	half := after.Sub(before) / 2
	want := before.Add(half).Add(ahead)
	d := guest.Sub(want)
	t.Logf("the guest's clock is %v off the host's (the date's round trip %v)", d, after.Sub(before))
	if d < -clockSlack-half || d > clockSlack+half {
		t.Fatalf("the guest's clock reads %v, %v off the host's %v", guest, d, want)
	}
}

// clockSlack is what wantClock allows beside the exec's round trip.
const clockSlack = 200 * time.Millisecond

// readCount reads the counter's pid and count.
func readCount(ctx context.Context, t *testing.T, c *control.Client) (pid, count int) {
	t.Helper()
	out := strings.Fields(run(ctx, t, c, "cat", "/dev/shm/pid", "/dev/shm/count"))
	if len(out) != 2 {
		t.Fatalf("the counter's files read %q", out)
	}
	pid, err1 := strconv.Atoi(out[0])
	count, err2 := strconv.Atoi(out[1])
	if err1 != nil || err2 != nil {
		t.Fatalf("the counter's files read %q", out)
	}
	return pid, count
}

// waitCount waits until the counter reaches at least n and returns its pid.
func waitCount(ctx context.Context, t *testing.T, c *control.Client, n int) int {
	t.Helper()
	for {
		if out := run(ctx, t, c, "sh", "-c", "cat /dev/shm/pid /dev/shm/count 2>/dev/null || true"); len(strings.Fields(out)) == 2 {
			f := strings.Fields(out)
			pid, _ := strconv.Atoi(f[0])
			if count, _ := strconv.Atoi(f[1]); count >= n {
				return pid
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the counter did not reach %d", n)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// copyDir copies the files of the directory src (as a capture's store would) into a new
// directory dst.
func copyDir(t *testing.T, src *os.File, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{shim.StateMemory, shim.StateMeta, shim.StateDisk} {
		in, err := platform.OpenFileAt(src, name, os.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		out.Close()
	}
}

// TestReleaseAndResume releases a running microVM's memory (saved to its state directory,
// QEMU ended, the shim and the launch living on) and restores it: the counter's process runs
// on with its pid, the guest keeps its machine id, and the saved memory goes with the resume.
func TestReleaseAndResume(t *testing.T) {
	r := newRuntime(t)
	ctx := vmContext(t)
	spec := testSpec(t, "rel")
	proc, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Kill(ctx, spec.Dir, proc) }()
	c := dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability)
	run(ctx, t, c, "sh", "-c", counterScript)
	pid := waitCount(ctx, t, c, 2)
	machine := run(ctx, t, c, "cat", "/etc/machine-id")
	// A plain stop and cont: the guest's clock stands while its vCPUs do, and the cont
	// advances it by that time, so that it reads the host's time after.
	if err := r.Freeze(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the length of the pause, not a wait for a condition
	if err := r.Thaw(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	wantClock(ctx, t, c, 0)
	t0 := time.Now()
	if err := r.ReleaseMemory(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("release of a 256 MiB guest's memory: %v", time.Since(t0))
	c.Close()
	root := filepath.Dir(filepath.Dir(spec.Dir))
	procs, err := r.Processes(root)
	if err != nil || len(procs) != 1 || procs[0].Role != runtime.RoleShim || !proc.Alive() {
		t.Fatalf("processes of a released microVM: %+v, %v; want its shim alone", procs, err)
	}
	if frozen, err := r.Frozen(spec.ID, spec.Dir); err != nil || !frozen {
		t.Fatalf("Frozen of a released microVM: %v, %v", frozen, err)
	}
	if _, err := os.Stat(filepath.Join(spec.Dir, shim.EntryMemory, shim.StateMemory)); err != nil {
		t.Fatalf("the released memory: %v", err)
	}
	t1 := time.Now()
	if err := r.Thaw(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("resume of a released 256 MiB guest to its listening: %v", time.Since(t1))
	c = dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability)
	defer c.Close()
	if p, _ := readCount(ctx, t, c); p != pid {
		t.Fatalf("the counter after the resume is pid %d, was %d", p, pid)
	}
	_, n := readCount(ctx, t, c)
	waitCount(ctx, t, c, n+2)
	wantClock(ctx, t, c, 0)
	if m := run(ctx, t, c, "cat", "/etc/machine-id"); m != machine {
		t.Fatalf("the machine id changed over a release: %q, was %q", m, machine)
	}
	if _, err := os.Stat(filepath.Join(spec.Dir, shim.EntryMemory)); err == nil {
		t.Fatal("the released memory is still there after the resume")
	}
	// A kill of a released launch ends it too.
	if err := r.ReleaseMemory(ctx, spec.ID, spec.Dir); err != nil {
		t.Fatal(err)
	}
	if err := r.Kill(ctx, spec.Dir, proc); err != nil {
		t.Fatal(err)
	}
	if proc.Alive() {
		t.Fatal("a released launch's shim outlived Kill")
	}
	if err := r.Cleanup(ctx, spec.ID, spec.Dir, proc); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(spec.Dir, shim.EntryMemory)); err == nil {
		t.Fatal("Cleanup left the released memory")
	}
}
