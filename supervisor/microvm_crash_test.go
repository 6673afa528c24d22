package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// envCrashVMAssets, set for the crash helper, makes it start a microVM sandbox, with the
// shared initramfs and base disk in the directory it names.
const envCrashVMAssets = "SUPERVISOR_TEST_CRASH_VM_ASSETS"

// vmSharedBase is the microvm runtime with every spec's host base set to one directory: the
// base disk takes seconds to make, once for all the test's state roots.
type vmSharedBase struct {
	*microvm.Runtime
	dir string
}

func (v vmSharedBase) Start(ctx context.Context, spec runtime.Spec) (platform.ProcessID, error) {
	spec.HostBase = v.dir
	return v.Runtime.Start(ctx, spec)
}

// openVM makes a supervisor on root with the namespace runtime as the default and the
// microvm runtime (under TCG, with its assets in assets) beside it; hook is the microvm
// runtime's step hook.
func openVM(root, assets string, hook func(string)) (*Supervisor, *microvm.Runtime, error) {
	st, err := store.Open(root)
	if err != nil {
		return nil, nil, err
	}
	ns, err := namespace.New(namespace.Config{CgroupParent: testCgroupParent})
	if err != nil {
		return nil, nil, err
	}
	vm, err := microvm.New(microvm.Config{Accel: microvm.AccelTCG, StepHook: hook})
	if err != nil {
		return nil, nil, err
	}
	s, err := New(Options{Store: st, Runtime: ns, Runtimes: []runtime.Runtime{vmSharedBase{vm, assets}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StopGrace: 5 * time.Second})
	return s, vm, err
}

// vmCrashHelper is the crash helper for a microVM: it starts the sandbox (or does the
// checkpoint operation envCrashCheckpoint names) and kills itself at the step envCrashAt
// names, one of the supervisor's or one of the microvm runtime's.
func vmCrashHelper(crash func(string)) error {
	s, _, err := openVM(os.Getenv(envCrashRoot), os.Getenv(envCrashVMAssets), crash)
	if err != nil {
		return err
	}
	s.crashPoint = crash
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if op := os.Getenv(envCrashCheckpoint); op != "" {
		return checkpointCrashOp(ctx, s, os.Getenv(envCrashID), op)
	}
	if name := os.Getenv(envCrashCapture); name != "" {
		if s.templates, err = template.Open(os.Getenv(envCrashRoot), template.Options{}); err == nil {
			_, err = s.Capture(ctx, name, os.Getenv(envCrashID))
		}
		return err
	}
	_, err = s.Start(ctx, os.Getenv(envCrashID))
	return err
}

// TestCrashMidMicroVMLaunch kills a process with SIGKILL at every step of a microVM's launch:
// after the journal, after the shared assets, after the sandbox's disk overlay, after the
// shim's spawn, after the journal names it (before the control socket: the guest is still
// booting), and after the runtime record. The next start (from another supervisor, as after
// a restart of bothyd) ends the interrupted launch, and then exactly one shim and one QEMU
// run; the file the sandbox wrote before is on its disk (nothing lost), and a stop leaves no
// microVM process (nothing orphaned). One sandbox goes through every step, so that its disk

// openTestVM opens a supervisor with the microVM runtime on a fresh state root (openVM),
// skipping the test where microVMs cannot run.
func openTestVM(t *testing.T) (s *Supervisor, vm *microvm.Runtime, root, assets string) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "root")
	assets = t.TempDir()
	s, vm, err := openVM(root, assets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if why := vm.Refusal(); why != nil {
		t.Skipf("microVMs cannot run here: %v", why)
	}
	return s, vm, root, assets
}

// writtenAndStopped provisions and starts the microVM id, writes content into the user's
// /home/user/kept.txt on its disk, and stops it gracefully.
func writtenAndStopped(ctx context.Context, t *testing.T, s *Supervisor, id string, content []byte) {
	t.Helper()
	if _, err := s.Provision(ctx, store.Config{ID: id, Runtime: microvm.Kind}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteFile(ctx, id, WriteRequest{Path: "/home/user/kept.txt", User: "user"}, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Stop(ctx, id, false); err != nil || st.State != StateStopped {
		t.Fatalf("graceful stop: %+v, %v", st, err)
	}
}

// removeTestVMs, at the test's end, stops and removes the sandboxes ids (with a context of
// its own: the test's is done by then), closes s, and fails the test for any microVM process
// left under root, which it kills.
func removeTestVMs(t *testing.T, s *Supervisor, vm *microvm.Runtime, root string, ids ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		for _, id := range ids {
			_, _ = s.Stop(ctx, id, true)
			_ = s.Deprovision(ctx, id)
		}
		s.Close()
		if procs, err := vm.Processes(root); err != nil || len(procs) != 0 {
			t.Errorf("microVM processes left after the test: %+v, %v", procs, err)
			for _, p := range procs {
				_ = platform.SignalVerified(p.ID, syscall.SIGKILL)
			}
		}
	})
}

// is the same throughout.
func TestCrashMidMicroVMLaunch(t *testing.T) {
	requireRoot(t)
	s, vm, root, assets := openTestVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const id = "vmcrash"
	removeTestVMs(t, s, vm, root, id)
	// A first run writes a file onto the sandbox's disk, which every crash must keep.
	content := []byte("written before the crashes\n")
	writtenAndStopped(ctx, t, s, id, content)

	for _, step := range []string{"journaled", microvm.AfterAssets, microvm.AfterOverlay, "spawned", "named", "recorded"} {
		t.Run(step, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envCrashRoot+"="+root, envCrashID+"="+id, envCrashAt+"="+step, envCrashVMAssets+"="+assets)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the helper did not die by SIGKILL at %s: %v\n%s", step, err, out)
			}

			st, err := s.Start(ctx, id)
			if step == "recorded" {
				// The launch committed before the crash: the microVM runs, and a second start
				// is refused.
				if errcode.Of(err) != errcode.AlreadyRunning {
					t.Fatalf("start after a crash past the commit: %v, want already-running", err)
				}
			} else if err != nil || st.State != StateRunning {
				t.Fatalf("start after a crash at %s: %+v, %v", step, st, err)
			}
			if err := vmProcesses(vm, root, 1); err != nil {
				t.Fatalf("after the crash at %s and a start: %v", step, err)
			}
			if got, err := vmCat(ctx, s, id, "/home/user/kept.txt"); err != nil || got != string(content) {
				t.Fatalf("the file written before, after the crash at %s: %q, %v", step, got, err)
			}
			if st, err := s.Stop(ctx, id, true); err != nil || st.State != StateStopped {
				t.Fatalf("forced stop: %+v, %v", st, err)
			}
			if err := vmProcesses(vm, root, 0); err != nil {
				t.Fatalf("after the stop: %v", err)
			}
		})
	}
}

// vmProcesses checks that exactly n shims and n QEMUs of the microvm runtime run under root.
func vmProcesses(vm *microvm.Runtime, root string, n int) error {
	procs, err := vm.Processes(root)
	if err != nil {
		return err
	}
	roles := map[runtime.Role]int{}
	for _, p := range procs {
		roles[p.Role]++
	}
	if roles[runtime.RoleShim] != n || roles[runtime.RoleInit] != n || len(procs) != 2*n {
		return fmt.Errorf("microVM processes %+v, want %d shim and %d QEMU", procs, n, n)
	}
	return nil
}

// vmCat runs cat path in the sandbox and returns its output.
func vmCat(ctx context.Context, s *Supervisor, id, path string) (string, error) {
	a, err := s.AdmitExec(ctx, id, time.Minute)
	if err != nil {
		return "", err
	}
	defer a.Release()
	res, err := s.RunExec(ctx, a, ExecRequest{Argv: []string{"cat", path}}, nil)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("cat exited %d: %s", res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return res.Stdout, nil
}

// TestCrashMidMicroVMFork kills a process with SIGKILL at every step of the fork of a
// microVM that stands on a checkpoint chain (so its disk is flattened), stopped and running:
// once the source is locked (fork-point; for a running one, after its freeze, its snapshot
// and its flatten), once a stopped source's disk is copied and flattened into the fork
// (fork-copied), a running one while frozen (fork-frozen), and in the fork's launch
// (journaled, spawned). After the restart (the start-up's reattach) the fork is gone (its
// create was pending), the source is as it was (stopped, or running and thawed, answering
// with its file) with exactly its own microVM processes, its checkpoints have nothing pending
// and no problem, and a fork made then holds the source's file. Runs under TCG: a few boots.
func TestCrashMidMicroVMFork(t *testing.T) {
	requireRoot(t)
	for _, running := range []bool{false, true} {
		name := "stopped"
		if running {
			name = "running"
		}
		t.Run(name, func(t *testing.T) { crashMidMicroVMFork(t, running) })
	}
}

func crashMidMicroVMFork(t *testing.T, running bool) {
	s, vm, root, assets := openTestVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const id, fork = "vmfksrc", "vmfk"
	removeTestVMs(t, s, vm, root, fork, id)
	content := []byte("written before the fork\n")
	writtenAndStopped(ctx, t, s, id, content)
	// On a chain: the disk rotated into a checkpoint layer (the fork's copy is flattened).
	if _, err := s.Checkpoint(ctx, id, "base"); err != nil {
		t.Fatal(err)
	}
	steps := []string{"fork-point", "fork-copied", "journaled", "spawned"}
	procs := 0
	if running {
		if _, err := s.Start(ctx, id); err != nil { // over its chain
			t.Fatal(err)
		}
		steps, procs = []string{"fork-frozen", "fork-point", "journaled", "spawned"}, 1
	}

	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envCrashRoot+"="+root, envCrashID+"="+id, envCrashAt+"="+step,
				envCrashVMAssets+"="+assets, envCrashCheckpoint+"=fork:"+fork)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the helper did not die by SIGKILL at %s: %v\n%s", step, err, out)
			}
			if err := s.ReattachAll(ctx, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if st, err := s.Status(fork); errcode.Of(err) != errcode.SandboxNotFound {
				t.Fatalf("the fork interrupted at %s is still there: %+v, %v", step, st, err)
			}
			if err := vmProcesses(vm, root, procs); err != nil {
				t.Fatalf("after the crash at %s: %v", step, err)
			}
			l, _, err := s.lockProvisioned(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			cp := s.checkpointSandbox(l)
			m, merr := cp.Manifest()
			problems, perr := cp.Problems()
			s.unlock(l)
			if merr != nil || perr != nil || m.Pending != nil || len(problems) != 0 || len(m.Checkpoints) != 1 {
				t.Fatalf("the source after the crash at %s: %+v, problems %v (%v %v)", step, m, problems, merr, perr)
			}
			want := StateStopped
			if running {
				want = StateRunning
			}
			if st, _ := s.Status(id); st.State != want {
				t.Fatalf("the source after the crash at %s: %+v; want it %s", step, st, want)
			}
			if running {
				if got, err := vmCat(ctx, s, id, "/home/user/kept.txt"); err != nil || got != string(content) {
					t.Fatalf("the running source after the crash at %s reads %q, %v", step, got, err)
				}
			}
		})
	}
	res, err := s.Fork(ctx, id, ForkRequest{IDs: []string{fork}})
	if err != nil || len(res.Forks) != 1 || res.Forks[0].Err != nil {
		t.Fatalf("the fork after the crashes: %+v, %v", res, err)
	}
	if got, err := vmCat(ctx, s, fork, "/home/user/kept.txt"); err != nil || got != string(content) {
		t.Fatalf("the fork reads %q, %v", got, err)
	}
	stop := []string{fork}
	if running {
		stop = append(stop, id)
	}
	for _, sb := range stop {
		if st, err := s.Stop(ctx, sb, true); err != nil || st.State != StateStopped {
			t.Fatalf("stop of %s: %+v, %v", sb, st, err)
		}
	}
	if err := vmProcesses(vm, root, 0); err != nil {
		t.Fatalf("after the stops: %v", err)
	}
}

// TestCrashMidMicroVMForkCheckpoint kills a process with SIGKILL at each step of a checkpoint
// of a microVM's fork, whose layer's disk is flattened onto the base disk: running (frozen,
// once the staging layer's disk is flattened, once its memory is in, once the layer is
// renamed in) and stopped (once its overlay is flattened in place, once it is rotated).
// After the restart (the start-up's reattach) the fork's checkpoints have nothing pending and
// no problem, each layer's disk stands on no file of the fork's fork-state, the fork is as it
// was (running and thawed, or stopped) and reads its file, and exactly its and its source's
// microVM processes run; a checkpoint taken then is rolled back to, and the fork reads its
// file. Runs under TCG.
func TestCrashMidMicroVMForkCheckpoint(t *testing.T) {
	requireRoot(t)
	s, vm, root, assets := openTestVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const id, fork = "vmfcsrc", "vmfc"
	removeTestVMs(t, s, vm, root, fork, id)
	if _, err := s.Provision(ctx, store.Config{ID: id, Runtime: microvm.Kind}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Fork(ctx, id, ForkRequest{IDs: []string{fork}}); err != nil || len(res.Forks) != 1 || res.Forks[0].Err != nil {
		t.Fatalf("the fork: %+v, %v", res, err)
	}
	content := []byte("written in the fork\n")
	if _, err := s.WriteFile(ctx, fork, WriteRequest{Path: "/home/user/kept.txt", User: "user"}, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	layersAlone := func(step string) {
		t.Helper()
		disks, _ := filepath.Glob(filepath.Join(root, "sandboxes", fork, "checkpoints", "layers", "*", "disk.qcow2"))
		if step == "after" && len(disks) == 0 {
			t.Fatal("the fork's checkpoint after the crashes has no layer disk")
		}
		for _, disk := range disks {
			out, err := exec.Command("qemu-img", "info", "-U", disk).CombinedOutput()
			if err != nil || strings.Contains(string(out), runtime.ForkStateName) {
				t.Fatalf("after the crash at %s, the layer disk %s: %v\n%s", step, disk, err, out)
			}
		}
	}
	for _, running := range []bool{true, false} {
		steps, want, procs := []string{"checkpoint-frozen", "checkpoint-flattened", "checkpoint-memory", "checkpoint-copied"}, StateRunning, 2
		if !running {
			if st, err := s.Stop(ctx, fork, false); err != nil || st.State != StateStopped {
				t.Fatalf("graceful stop: %+v, %v", st, err)
			}
			steps, want, procs = []string{"checkpoint-flattened", "checkpoint-rotated"}, StateStopped, 1
		}
		for _, step := range steps {
			t.Run(step, func(t *testing.T) {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), envCrashRoot+"="+root, envCrashID+"="+fork, envCrashAt+"="+step,
					envCrashVMAssets+"="+assets, envCrashCheckpoint+"=checkpoint:"+strings.ReplaceAll(step, "checkpoint-", "c-"))
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
					t.Fatalf("the helper did not die by SIGKILL at %s: %v\n%s", step, err, out)
				}
				if err := s.ReattachAll(ctx, 5*time.Second); err != nil {
					t.Fatal(err)
				}
				if err := vmProcesses(vm, root, procs); err != nil {
					t.Fatalf("after the crash at %s: %v", step, err)
				}
				l, _, err := s.lockProvisioned(ctx, fork)
				if err != nil {
					t.Fatal(err)
				}
				cp := s.checkpointSandbox(l)
				m, merr := cp.Manifest()
				problems, perr := cp.Problems()
				s.unlock(l)
				if merr != nil || perr != nil || m.Pending != nil || len(problems) != 0 {
					t.Fatalf("the fork after the crash at %s: %+v, problems %v (%v %v)", step, m, problems, merr, perr)
				}
				layersAlone(step)
				if st, _ := s.Status(fork); st.State != want {
					t.Fatalf("the fork after the crash at %s: %+v; want it %s", step, st, want)
				}
				if running {
					if got, err := vmCat(ctx, s, fork, "/home/user/kept.txt"); err != nil || got != string(content) {
						t.Fatalf("the running fork after the crash at %s reads %q, %v", step, got, err)
					}
				}
			})
		}
	}
	if _, err := s.Checkpoint(ctx, fork, "after"); err != nil {
		t.Fatalf("the checkpoint after the crashes: %v", err)
	}
	layersAlone("after")
	if _, err := s.Rollback(ctx, fork, "after"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, fork); err != nil {
		t.Fatal(err)
	}
	if got, err := vmCat(ctx, s, fork, "/home/user/kept.txt"); err != nil || got != string(content) {
		t.Fatalf("the fork on its checkpoint reads %q, %v", got, err)
	}
}

// TestCrashMidMicroVMChainCapture kills a process with SIGKILL while it captures a running
// microVM that stands on a checkpoint chain (its snapshot's disk is flattened): while the VM
// is frozen (capture-frozen) and once the snapshot is flattened, after the thaw
// (capture-flattened). After the restart (the start-up's reattach) the VM runs thawed with its
// file, the template has no generation and the template store's check finds nothing; a
// capture then makes a generation whose disk names no file of the sandbox.
func TestCrashMidMicroVMChainCapture(t *testing.T) {
	requireRoot(t)
	s, vm, root, assets := openTestVM(t)
	var err error
	if s.templates, err = template.Open(root, template.Options{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const id, tpl = "vmcap", "vmcaptpl"
	removeTestVMs(t, s, vm, root, id)
	content := []byte("written before the capture\n")
	writtenAndStopped(ctx, t, s, id, content)
	// On a chain: the disk rotated into a checkpoint layer, the next start's over it.
	if _, err := s.Checkpoint(ctx, id, "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.templates.CreateTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"capture-frozen", "capture-flattened"} {
		t.Run(step, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envCrashRoot+"="+root, envCrashID+"="+id, envCrashAt+"="+step,
				envCrashVMAssets+"="+assets, envCrashCapture+"="+tpl)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the helper did not die by SIGKILL at %s: %v\n%s", step, err, out)
			}
			if err := s.ReattachAll(ctx, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := vmProcesses(vm, root, 1); err != nil {
				t.Fatalf("after the crash at %s: %v", step, err)
			}
			if st, _ := s.Status(id); st.State != StateRunning {
				t.Fatalf("the VM after the crash at %s: %+v", step, st)
			}
			if got, err := vmCat(ctx, s, id, "/home/user/kept.txt"); err != nil || got != string(content) {
				t.Fatalf("the VM after the crash at %s reads %q, %v", step, got, err)
			}
			now, err := s.templates.Now()
			if err != nil {
				t.Fatal(err)
			}
			if gens, err := s.templates.Generations(tpl, now); err != nil || len(gens) != 0 {
				t.Fatalf("the template after the crash at %s: %+v, %v", step, gens, err)
			}
			if problems, err := s.templates.Check(ctx, func(string, string) bool { return true }, false); err != nil || len(problems) != 0 {
				t.Fatalf("the template store after the crash at %s: %+v, %v", step, problems, err)
			}
		})
	}
	g, err := s.Capture(ctx, tpl, id)
	if err != nil {
		t.Fatalf("the capture after the crashes: %v", err)
	}
	disk := filepath.Join(root, template.TemplatesDir, tpl, g.ID, template.PayloadDir, "disk.qcow2")
	out, err := exec.Command("qemu-img", "info", "-U", disk).CombinedOutput()
	if err != nil || strings.Contains(string(out), store.SandboxesDir+"/") {
		t.Fatalf("the generation's disk %s: %v\n%s", disk, err, out)
	}
}

// TestForkCheckpointBeforeRestore: a fork whose saved state is still to be restored (its first
// start did not finish) is refused a checkpoint with checkpoint-unsupported, and nothing is
// recorded: its next start restores that state over a disk made anew over its fork-state.
func TestForkCheckpointBeforeRestore(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	s, vm, err := openVM(root, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if why := vm.Refusal(); why != nil {
		t.Skipf("microVMs cannot run here: %v", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const id = "vmunrestored"
	if _, err := s.Provision(ctx, store.Config{ID: id, Runtime: microvm.Kind}); err != nil {
		t.Fatal(err)
	}
	dir, err := s.store.Dir(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, runtime.ForkStateName), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeRestoreRecord(dir, &restoreRecord{Format: restoreFormat, Fork: &forkRestore{Source: "src", SavedAt: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, id, "a"); errcode.Of(err) != errcode.CheckpointUnsupported {
		t.Fatalf("the checkpoint of a fork not restored yet: %v; want checkpoint-unsupported", err)
	}
	if cps, err := s.Checkpoints(ctx, id); err != nil || len(cps) != 0 {
		t.Fatalf("the fork's checkpoints after the refusal: %+v, %v", cps, err)
	}
}
