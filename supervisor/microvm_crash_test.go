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

// vmCrashHelper is the crash helper for a microVM: it starts the sandbox and kills itself at
// the step envCrashAt names, one of the supervisor's or one of the microvm runtime's.
func vmCrashHelper(crash func(string)) error {
	s, _, err := openVM(os.Getenv(envCrashRoot), os.Getenv(envCrashVMAssets), crash)
	if err != nil {
		return err
	}
	s.crashPoint = crash
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
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
// is the same throughout.
func TestCrashMidMicroVMLaunch(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	assets := t.TempDir()
	s, vm, err := openVM(root, assets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if why := vm.Refusal(); why != nil {
		t.Skipf("microVMs cannot run here: %v", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const id = "vmcrash"
	t.Cleanup(func() {
		_, _ = s.Stop(ctx, id, true)
		_ = s.Deprovision(ctx, id)
		s.Close()
		if procs, err := vm.Processes(root); err != nil || len(procs) != 0 {
			t.Errorf("microVM processes left after the test: %+v, %v", procs, err)
			for _, p := range procs {
				_ = platform.SignalVerified(p.ID, syscall.SIGKILL)
			}
		}
	})
	if _, err := s.Provision(ctx, store.Config{ID: id, Runtime: microvm.Kind}); err != nil {
		t.Fatal(err)
	}
	// A first run writes a file onto the sandbox's disk, which every crash must keep.
	if _, err := s.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	content := []byte("written before the crashes\n")
	if _, err := s.WriteFile(ctx, id, WriteRequest{Path: "/home/user/kept.txt", User: "user"}, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Stop(ctx, id, false); err != nil || st.State != StateStopped {
		t.Fatalf("graceful stop: %+v, %v", st, err)
	}

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
