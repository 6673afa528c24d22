package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store/template"
)

// envCrashCheckpoint names a checkpoint operation ("checkpoint:<name>", "rollback:<name>",
// "delete:<name>") that the crash helper runs instead of a start.
const envCrashCheckpoint = "SUPERVISOR_TEST_CRASH_CHECKPOINT"

func checkpointCrashOp(ctx context.Context, s *Supervisor, id, op string) error {
	verb, name, _ := strings.Cut(op, ":")
	var err error
	switch verb {
	case "checkpoint":
		_, err = s.Checkpoint(ctx, id, name)
	case "rollback":
		_, err = s.Rollback(ctx, id, name)
	case "delete":
		err = s.DeleteCheckpoint(ctx, id, name)
	case "fork":
		_, err = s.Fork(ctx, id, ForkRequest{IDs: []string{name}})
	default:
		err = errors.New("unknown operation " + op)
	}
	return err
}

// sh runs a shell command in the sandbox as root and returns its stdout.
func sh(t *testing.T, ctx context.Context, s *Supervisor, id, script string) string {
	t.Helper()
	a, err := s.AdmitExec(ctx, id, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	res, err := s.RunExec(ctx, a, ExecRequest{Argv: []string{"sh", "-c", script}, User: "root"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("%q exited %d: %s", script, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

// TestCheckpointAndRollback: a running sandbox's checkpoint is taken frozen, a stopped one's
// by rotation; a rollback after rm -rf of the user's home brings it back, in place (the
// sandbox runs again under its id), and later files are gone.
func TestCheckpointAndRollback(t *testing.T) {
	s, _ := newSupervisor(t)
	ctx := testContext(t)
	startNew(t, ctx, s, "ck")
	sh(t, ctx, s, "ck", "echo one > /home/user/f && mkdir -p /home/user/d && echo deep > /home/user/d/g")
	c, err := s.Checkpoint(ctx, "ck", "first")
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != "copy" || c.Size == 0 {
		t.Fatalf("checkpoint of a running sandbox: %+v, want a copy with a size", c)
	}
	sh(t, ctx, s, "ck", "rm -rf /home/user && echo later > /tmp/later")
	if _, err := s.Rollback(ctx, "ck", "first"); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Status("ck"); err != nil || st.State != StateRunning {
		t.Fatalf("after the rollback of a running sandbox: %+v, %v; want it running", st, err)
	}
	if got := sh(t, ctx, s, "ck", "cat /home/user/f /home/user/d/g; ls /tmp/later 2>/dev/null || echo gone"); got != "one\ndeep\ngone\n" {
		t.Fatalf("after the rollback the files read %q", got)
	}

	// Stopped: a rotation, then writes on top of it, then a rollback to it.
	if _, err := s.Stop(ctx, "ck", true); err != nil {
		t.Fatal(err)
	}
	c, err = s.Checkpoint(ctx, "ck", "second")
	if err != nil || c.Mode != "rotate" || len(c.Chain) != 2 {
		t.Fatalf("checkpoint of a stopped sandbox: %+v, %v; want a rotation over the first", c, err)
	}
	if _, err := s.Start(ctx, "ck"); err != nil {
		t.Fatal(err)
	}
	sh(t, ctx, s, "ck", "echo two > /home/user/f")
	if _, err := s.Stop(ctx, "ck", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rollback(ctx, "ck", "second"); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Status("ck"); st.State != StateStopped {
		t.Fatalf("a rollback started a stopped sandbox: %s", st.State)
	}
	if _, err := s.Start(ctx, "ck"); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ctx, s, "ck", "cat /home/user/f"); got != "one\n" {
		t.Fatalf("after the rollback to the rotation: %q", got)
	}
	list, err := s.Checkpoints(ctx, "ck")
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if err := s.DeleteCheckpoint(ctx, "ck", "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rollback(ctx, "ck", "first"); errcode.Of(err) != errcode.CheckpointNotFound {
		t.Fatalf("rollback to a deleted checkpoint: %v", err)
	}
	// The sandbox's files still stand on the deleted checkpoint's layer (its chain names it).
	if got := sh(t, ctx, s, "ck", "cat /home/user/d/g"); got != "deep\n" {
		t.Fatalf("after deleting a checkpoint below the chain: %q", got)
	}
}

// TestCheckpointCrash kills a process (SIGKILL) at each step of a checkpoint, a rollback and
// a delete; the next supervisor's reattach finishes or undoes it: the sandbox's files are at
// one point or the other, nothing is pending, and nothing is left over.
func TestCheckpointCrash(t *testing.T) {
	type tc struct {
		op      string
		step    string
		running bool
		disk    bool
	}
	var cases []tc
	for _, st := range []string{"checkpoint-frozen", "checkpoint-recorded", "checkpoint-copied", "checkpoint-committed"} {
		cases = append(cases, tc{"checkpoint:new", st, true, false})
	}
	for _, st := range []string{"checkpoint-recorded", "checkpoint-rotated", "checkpoint-committed"} {
		cases = append(cases, tc{"checkpoint:new", st, false, false})
	}
	for _, st := range []string{"rollback-stopped", "rollback-recorded", "rollback-discarded", "rollback-swapped", "rollback-committed"} {
		cases = append(cases, tc{"rollback:base", st, true, false})
	}
	cases = append(cases, tc{"delete:base", "checkpoint-deleted", true, false})
	for _, st := range []string{"rollback-recorded", "rollback-discarded", "rollback-swapped", "rollback-committed"} {
		cases = append(cases, tc{"rollback:base", st, true, true})
	}
	for _, st := range []string{"checkpoint-recorded", "checkpoint-committed"} {
		cases = append(cases, tc{"checkpoint:new", st, false, true})
	}
	for _, st := range []string{"fork-frozen", "fork-point", "fork-linked", "journaled", "spawned"} {
		cases = append(cases, tc{"fork:fk", st, true, false})
	}
	for _, st := range []string{"checkpoint-recorded", "checkpoint-rotated", "fork-point", "fork-linked"} {
		cases = append(cases, tc{"fork:fk", st, false, false})
	}
	for _, c := range cases {
		name := strings.ReplaceAll(c.op, ":", "-") + "/" + c.step
		if !c.running {
			name += "/stopped"
		}
		if c.disk {
			name += "/disk"
		}
		t.Run(name, func(t *testing.T) {
			s, root := newSupervisor(t)
			ctx := testContext(t)
			id := "crash"
			if c.disk {
				if err := s.checkDisk("", 64); err != nil {
					t.Skipf("no disks of their own here: %v", err)
				}
				if _, err := s.Create(ctx, CreateRequest{ID: id, Start: true, DiskMB: 64}); err != nil {
					t.Fatal(err)
				}
			} else {
				startNew(t, ctx, s, id)
			}
			sh(t, ctx, s, id, "echo base > /home/user/f")
			if _, err := s.Checkpoint(ctx, id, "base"); err != nil {
				t.Fatal(err)
			}
			sh(t, ctx, s, id, "echo later > /home/user/f")
			if !c.running {
				if _, err := s.Stop(ctx, id, true); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envCrashRoot+"="+root, envCrashID+"="+id, envCrashAt+"="+c.step, envCrashCheckpoint+"="+c.op)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the helper did not die by SIGKILL at %s: %v\n%s", c.step, err, out)
			}
			// The restart: start-up's reattach (which thaws a sandbox left frozen).
			if err := s.ReattachAll(ctx, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			l, _, err := s.lockProvisioned(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			cp := s.checkpointSandbox(l)
			m, merr := cp.Manifest()
			problems, perr := cp.Problems()
			s.unlock(l)
			if merr != nil || perr != nil || m.Pending != nil || len(problems) != 0 {
				t.Fatalf("after the crash and reattach: pending %+v, problems %v (%v %v)", m.Pending, problems, merr, perr)
			}
			if st, _ := s.Status(id); st.State != StateRunning {
				if _, err := s.Start(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			got := sh(t, ctx, s, id, "cat /home/user/f")
			if got != "base\n" && got != "later\n" {
				t.Fatalf("after the crash the file reads %q: neither point", got)
			}
			if strings.HasPrefix(c.op, "rollback") && c.step != "rollback-stopped" && got != "base\n" {
				t.Fatalf("a rollback recorded before the crash was not finished: %q", got)
			}
			if strings.HasPrefix(c.op, "fork") {
				// The fork's create was all or nothing: the start-up removed it.
				if st, err := s.Status("fk"); errcode.Of(err) != errcode.SandboxNotFound {
					t.Fatalf("the fork interrupted at %s is still there: %+v, %v", c.step, st, err)
				}
				if _, err := s.Fork(ctx, id, ForkRequest{IDs: []string{"fk"}}); err != nil {
					t.Fatal(err)
				}
				if got := sh(t, ctx, s, "fk", "cat /home/user/f"); got != "later\n" {
					t.Fatalf("the fork made after the crash reads %q", got)
				}
			}
			// The sandbox works on: another checkpoint and a rollback to it.
			if _, err := s.Checkpoint(ctx, id, "after"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Rollback(ctx, id, "after"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestForkRunning forks a sandbox in the middle of a running process: the files written
// before the fork are in every fork, a write after it in one fork is seen neither in the
// other nor in the source, nor the source's in the forks; the source runs on.
func TestForkRunning(t *testing.T) {
	s, _ := newSupervisor(t)
	ctx := testContext(t)
	startNew(t, ctx, s, "src")
	sh(t, ctx, s, "src", "echo before > /home/user/f; (i=0; while :; do i=$((i+1)); echo $i > /home/user/.c; mv /home/user/.c /home/user/counter; sleep 0.01; done) >/dev/null 2>&1 &")
	// The loop is started in the background: the fork's point must come after its first write.
	sh(t, ctx, s, "src", "until test -s /home/user/counter; do sleep 0.01; done")
	res, err := s.Fork(ctx, "src", ForkRequest{IDs: []string{"fork-a", "fork-b"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Forks {
		if f.Err != nil || f.Status == nil || f.Status.State != StateRunning {
			t.Fatalf("fork %s: %+v, %v", f.ID, f.Status, f.Err)
		}
	}
	if st, err := s.Status("src"); err != nil || st.State != StateRunning {
		t.Fatalf("the source after the fork: %+v, %v", st, err)
	}
	sh(t, ctx, s, "fork-a", "echo a > /home/user/mine")
	sh(t, ctx, s, "src", "echo after > /home/user/f")
	for _, id := range []string{"fork-a", "fork-b"} {
		if got := sh(t, ctx, s, id, "cat /home/user/f; test -s /home/user/counter && echo counted"); got != "before\ncounted\n" {
			t.Fatalf("%s reads %q; want the files of the fork's point", id, got)
		}
	}
	for _, id := range []string{"fork-b", "src"} {
		if got := sh(t, ctx, s, id, "cat /home/user/mine 2>/dev/null || echo none"); got != "none\n" {
			t.Fatalf("%s sees fork-a's write: %q", id, got)
		}
	}
	// The forks' files outlive the source.
	if err := s.Delete(ctx, "src", true); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ctx, s, "fork-b", "cat /home/user/f"); got != "before\n" {
		t.Fatalf("fork-b after the source's delete: %q", got)
	}
	if _, err := s.Fork(ctx, "fork-b", ForkRequest{Count: MaxForks + 1}); errcode.Of(err) != errcode.InvalidRequest {
		t.Fatalf("a fork of %d: %v; want invalid-request", MaxForks+1, err)
	}
	if _, err := s.Fork(ctx, "fork-b", ForkRequest{IDs: []string{"fork-a"}}); err != nil {
		t.Fatal(err)
	} else if res, _ := s.Fork(ctx, "fork-b", ForkRequest{IDs: []string{"fork-a", "fork-c"}}); res.Forks[0].Err == nil || res.Forks[1].Err != nil {
		t.Fatalf("a fork onto a taken id and a free one: %+v; want the first to fail alone", res.Forks)
	}
}

// TestCheckpointDisk: a sandbox with a disk of its own is checkpointed by a copy of its
// disk's upper (frozen when running), rolled back by a fresh disk over the checkpoint's
// layers, and forked with disks of their own.
func TestCheckpointDisk(t *testing.T) {
	s, _ := newSupervisor(t)
	if err := s.checkDisk("", 64); err != nil {
		t.Skipf("no disks of their own here: %v", err)
	}
	ctx := testContext(t)
	if _, err := s.Create(ctx, CreateRequest{ID: "dk", Start: true, DiskMB: 64}); err != nil {
		t.Fatal(err)
	}
	sh(t, ctx, s, "dk", "echo on-disk > /home/user/f")
	c, err := s.Checkpoint(ctx, "dk", "a")
	if err != nil || c.Mode != "copy" || c.Size == 0 {
		t.Fatalf("checkpoint of a running disk sandbox: %+v, %v", c, err)
	}
	sh(t, ctx, s, "dk", "rm -rf /home/user")
	if _, err := s.Rollback(ctx, "dk", "a"); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ctx, s, "dk", "cat /home/user/f"); got != "on-disk\n" {
		t.Fatalf("after the rollback of a disk sandbox: %q", got)
	}
	// Stopped: a copy too (a disk cannot be rotated), then a fork of the stopped sandbox.
	if _, err := s.Stop(ctx, "dk", true); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Checkpoint(ctx, "dk", "b"); err != nil || c.Mode != "copy" {
		t.Fatalf("checkpoint of a stopped disk sandbox: %+v, %v", c, err)
	}
	res, err := s.Fork(ctx, "dk", ForkRequest{IDs: []string{"dk-fork"}})
	if err != nil || res.Forks[0].Err != nil {
		t.Fatalf("fork of a disk sandbox: %+v, %v", res, err)
	}
	if got := sh(t, ctx, s, "dk-fork", "cat /home/user/f; df -m / | tail -1 | awk '{print $2 <= 64}'"); got != "on-disk\n1\n" {
		t.Fatalf("the disk sandbox's fork reads %q; want the file and a disk of 64 MiB", got)
	}
}

// noLiveLayer hides the runtime's LiveLayerer, as a runtime without checkpoints is.
type noLiveLayer struct{ runtime.Runtime }

// TestCheckpointUnsupported: a runtime without live layers refuses checkpoints, rollback and
// fork with checkpoint-unsupported.
func TestCheckpointUnsupported(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	s, err := open(root, func(rt runtime.Runtime) runtime.Runtime { return noLiveLayer{rt} })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := testContext(t)
	if _, err := s.Provision(ctx, Config{ID: "nl"}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Deprovision(ctx, "nl") }()
	if _, err := s.Checkpoint(ctx, "nl", "a"); errcode.Of(err) != errcode.CheckpointUnsupported {
		t.Fatalf("checkpoint: %v", err)
	}
	if _, err := s.Rollback(ctx, "nl", "a"); errcode.Of(err) != errcode.CheckpointUnsupported {
		t.Fatalf("rollback: %v", err)
	}
	if _, err := s.Fork(ctx, "nl", ForkRequest{Count: 1}); errcode.Of(err) != errcode.CheckpointUnsupported {
		t.Fatalf("fork: %v", err)
	}
}

// TestChainFlattensWithWhiteouts: past checkpoint.MaxChain rotations the chain is flattened;
// files removed along the way (whiteouts in the layers, over the image's files too) stay
// removed in the flattened layer, and the sandbox runs on it.
func TestChainFlattensWithWhiteouts(t *testing.T) {
	s, _ := newSupervisor(t)
	s.checkpointLimits = checkpoint.Limits{Count: 64}
	ctx := testContext(t)
	startNew(t, ctx, s, "flat")
	sh(t, ctx, s, "flat", "rm /etc/hostname.bak 2>/dev/null; rm -f /etc/os-release; echo 0 > /home/user/f0")
	for i := 1; i <= checkpoint.MaxChain+2; i++ {
		if _, err := s.Stop(ctx, "flat", true); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Checkpoint(ctx, "flat", fmt.Sprintf("c%d", i)); err != nil {
			t.Fatalf("checkpoint %d: %v", i, err)
		}
		if _, err := s.Start(ctx, "flat"); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		sh(t, ctx, s, "flat", fmt.Sprintf("rm /home/user/f%d && echo %d > /home/user/f%d", i-1, i, i))
	}
	l, _, err := s.lockProvisioned(ctx, "flat")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.checkpointSandbox(l).Manifest()
	s.unlock(l)
	if err != nil || len(m.Chain) > checkpoint.MaxChain {
		t.Fatalf("the chain holds %d layers (%v)", len(m.Chain), err)
	}
	n := checkpoint.MaxChain + 2
	want := fmt.Sprintf("f%d\nno os-release\n", n)
	if got := sh(t, ctx, s, "flat", "ls /home/user; test -e /etc/os-release && echo os-release || echo no os-release"); got != want {
		t.Fatalf("after the flattening the sandbox has %q, want %q", got, want)
	}
}

// TestCaptureOfARolledBackSandbox: a sandbox that stands on a checkpoint chain is captured
// whole (the chain merged under its upper), and a clone of the generation has its files.
func TestCaptureOfARolledBackSandbox(t *testing.T) {
	s, root := newSupervisor(t)
	ts, err := template.Open(root, template.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.templates = ts
	ctx := testContext(t)
	startNew(t, ctx, s, "rb")
	sh(t, ctx, s, "rb", "echo chain > /home/user/in-chain")
	if _, err := s.Stop(ctx, "rb", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, "rb", "a"); err != nil { // a rotation: the file is in the chain
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, "rb"); err != nil {
		t.Fatal(err)
	}
	sh(t, ctx, s, "rb", "echo upper > /home/user/in-upper")
	if _, err := s.Stop(ctx, "rb", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTemplate(ctx, "tpl"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Capture(ctx, "tpl", "rb"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, CreateRequest{ID: "cl", Start: true, Clone: &CloneRequest{Template: "tpl"}}); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ctx, s, "cl", "cat /home/user/in-chain /home/user/in-upper"); got != "chain\nupper\n" {
		t.Fatalf("the clone of a sandbox on a chain reads %q", got)
	}
}
