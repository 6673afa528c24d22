//go:build linux

package volume

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// The crash tests re-execute the test binary as a child that creates or deletes a volume and
// kills itself with SIGKILL at one step (crashChildEnv names it): a real process dies
// mid-way, as bothyd would, and the parent then looks at what it left.
const (
	crashChildEnv = "BOTHY_VOLUME_CRASH_AT"
	crashRootEnv  = "BOTHY_VOLUME_CRASH_ROOT"
	crashOpEnv    = "BOTHY_VOLUME_CRASH_OP"
)

func TestMain(m *testing.M) {
	if step := os.Getenv(crashChildEnv); step != "" {
		os.Exit(crashChild(step))
	}
	os.Exit(m.Run())
}

func crashChild(step string) int {
	s, err := Open(os.Getenv(crashRootEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s.crashPoint = func(at string) {
		if at == step {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	if os.Getenv(crashOpEnv) == "delete" {
		err = s.Delete("v")
	} else {
		_, err = s.Create(context.Background(), "v", MinSizeMB)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0 // the step was not reached
}

// TestVolumeCrashAtEveryStep kills a create and a delete at each of their steps and checks
// that what is left is either no volume or a ready, mounted one, never a half: start-up's
// recovery (Recover, as bothyd runs it) removes a half-made volume and finishes a delete,
// after which the check finds nothing, and no mount or loop device is left.
func TestVolumeCrashAtEveryStep(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("volumes need root (loop devices and mounts)")
	}
	for _, c := range []struct {
		op, step string
		// exists: the volume is there, ready, after the recovery.
		exists bool
	}{
		{"create", "recorded", false},
		{"create", "image", false},
		{"create", "mounted", false},
		{"create", "ready", true},
		{"delete", "deleting", false},
		{"delete", "unmounted", false},
	} {
		t.Run(c.op+"/"+c.step, func(t *testing.T) {
			root := t.TempDir()
			s, err := Open(root)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.teardown("v") })
			if c.op == "delete" {
				if _, err := s.Create(context.Background(), "v", MinSizeMB); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashChildEnv+"="+c.step, crashRootEnv+"="+root, crashOpEnv+"="+c.op)
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the child did not die at %s: %v\n%s", c.step, err, out)
			}
			if c.step != "ready" {
				// Something is left to recover, and the check says what.
				if probs, err := s.Check(false); err != nil || len(probs) == 0 {
					t.Fatalf("check after a crash at %s found nothing (%v)", c.step, err)
				}
			}
			if err := s.Recover(); err != nil {
				t.Fatal(err)
			}
			if probs, err := s.Check(false); err != nil || len(probs) != 0 {
				t.Fatalf("check after the recovery: %v %v", probs, err)
			}
			_, err = s.Get("v")
			if got := err == nil; got != c.exists {
				t.Fatalf("after the recovery the volume exists: %v, want %v (%v)", got, c.exists, err)
			}
			if c.exists {
				if ok, _ := s.mounted("v"); !ok {
					t.Fatal("the ready volume is not mounted")
				}
				return
			}
			if _, err := os.Lstat(filepath.Join(s.dir, "v")); !os.IsNotExist(err) {
				t.Fatalf("the volume's directory is still there: %v", err)
			}
			loops, _ := s.loopOf("v")
			if loops != "" {
				t.Fatalf("loop device %s still backed by the image", loops)
			}
		})
	}
}
