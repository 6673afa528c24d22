//go:build linux

package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"golang.org/x/sys/unix"
)

// A declared directory that is still a mount point must not be removed through: that would
// delete what the mount shows. The refusal also shows that the configuration record goes last:
// a removal that stops half-way leaves a provisioned sandbox.
func TestDeprovisionRefusesMountedDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs; CI runs as root")
	}
	s := newStore(t)
	provision(t, s, "a")
	l := lockExisting(t, s, "a")
	rootfs := filepath.Join(l.Dir(), "rootfs")
	if err := os.Mkdir(rootfs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", rootfs, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(rootfs, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(rootfs, "in-mount"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantCode(t, l.Deprovision(timeout(t, time.Second)), errcode.SandboxLaunched)
	if !exists(filepath.Join(rootfs, "in-mount")) {
		t.Fatal("removal deleted a file inside a mount")
	}
	if _, err := l.Config(); err != nil {
		t.Fatalf("the configuration record went before the removal finished: %v", err)
	}
	if err := unix.Unmount(rootfs, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.Deprovision(timeout(t, time.Second)); err != nil {
		t.Fatalf("Deprovision after unmounting = %v", err)
	}
}
