//go:build linux

package platform

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMountsUnderAndUnmount(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	errc := make(chan error, 1)
	go func() {
		// This thread gets a mount namespace of its own and never returns to the scheduler
		// (no UnlockOSThread), so nothing mounted here reaches the host or other tests.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := MakePrivate("/"); err != nil {
				return err
			}
			a := filepath.Join(dir, "a")
			if err := os.Mkdir(a, 0o755); err != nil {
				return err
			}
			if err := Mount("tmpfs", a, "tmpfs", 0, "size=64k"); err != nil {
				return err
			}
			b := filepath.Join(a, "b")
			if err := os.Mkdir(b, 0o755); err != nil {
				return err
			}
			if err := BindReadOnly("/usr", b); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(b, "x"), nil, 0o644); err == nil {
				t.Error("a read-only bind took a write")
			}
			got, err := MountsUnder(dir)
			if err != nil {
				return err
			}
			if len(got) != 2 || got[0] != b || got[1] != a {
				t.Errorf("MountsUnder = %v, want [%s %s]", got, b, a)
			}
			if err := UnmountUnder(dir); err != nil {
				return err
			}
			if got, _ := MountsUnder(dir); len(got) != 0 {
				t.Errorf("mounts left after UnmountUnder: %v", got)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if got, _ := MountsUnder(dir); len(got) != 0 {
		t.Fatalf("the test's mounts reached the host: %v", got)
	}
}
