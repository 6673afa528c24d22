//go:build linux

package microvm

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

// TestVolumesThroughVirtioFS boots a microVM with one host directory (a small tmpfs, standing
// in for a volume's host mount) mounted twice, read-write and read-only. The guest's user
// writes a file that the host sees at once, owned by uid 1000; the guest reads a file the
// host wrote after the boot; the read-only mount refuses a write, and still refuses it after
// the guest's root remounts it read-write (the host enforces it); a write past the file
// system's size fails with ENOSPC; nothing outside the shared directory is reachable. The
// virtiofsds are not listed as the sandbox's init (QEMU is).
func TestVolumesThroughVirtioFS(t *testing.T) {
	r := newRuntime(t)
	if err := r.VolumeSupport(); err != nil {
		t.Skipf("no volumes here: %v", err)
	}
	ctx := vmContext(t)
	spec := testSpec(t, "vmvol")
	src := filepath.Join(t.TempDir(), "vol")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", src, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=8m,mode=0755,uid=1000,gid=1000"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(src, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(filepath.Dir(src), "outside"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec.Volumes = []runtime.VolumeMount{{Source: src, Target: "/data"}, {Source: src, Target: "/mnt/ro", ReadOnly: true}}
	proc, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Kill(context.Background(), spec.Dir, proc)
		_ = r.Cleanup(context.Background(), spec.ID, spec.Dir, proc)
	})
	c := dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability)
	defer c.Close()
	// The shim's virtiofsds are no init of the sandbox: its one init is QEMU.
	procs, err := r.Processes(filepath.Dir(spec.Dir))
	if err != nil {
		t.Fatal(err)
	}
	var inits []string
	for _, p := range procs {
		if p.Role == runtime.RoleInit && p.Dir == spec.Dir {
			exe, _ := os.Readlink("/proc/" + strconv.Itoa(p.ID.Pid) + "/exe")
			inits = append(inits, exe)
		}
	}
	if len(inits) != 1 || filepath.Base(inits[0]) != "qemu-system-x86_64" {
		t.Fatalf("the sandbox's inits: %q", inits)
	}

	if got := run(ctx, t, c, "sh", "-c", "echo from-guest > /data/g && stat -c %u:%g /data/g"); got != "1000:1000\n" {
		t.Fatalf("the guest user's file: %q", got)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(src, "g"), &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
		t.Fatalf("the guest's file on the host: %+v, %v", st, err)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "g")); string(b) != "from-guest\n" {
		t.Fatalf("the guest's file reads %q on the host", b)
	}
	if err := os.WriteFile(filepath.Join(src, "h"), []byte("from-host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := run(ctx, t, c, "cat", "/data/h", "/mnt/ro/g"); got != "from-host\nfrom-guest\n" {
		t.Fatalf("the host's file and the guest's through the read-only mount: %q", got)
	}
	ro := execAs(ctx, t, c, "root", "echo x > /mnt/ro/x; mount -o remount,rw /mnt/ro; echo y > /mnt/ro/y; cat /mnt/ro/y")
	if ro.code == 0 || strings.Count(ro.stderr, "Read-only file system") < 2 {
		t.Fatalf("writes through the read-only mount, before and after the guest's remount: %+v", ro)
	}
	for _, n := range []string{"x", "y"} {
		if _, err := os.Lstat(filepath.Join(src, n)); err == nil {
			t.Fatalf("a write through the read-only mount reached the host: %s", n)
		}
	}
	full := execAs(ctx, t, c, "user", "dd if=/dev/zero of=/data/big bs=1M count=16")
	if full.code == 0 || !strings.Contains(full.stderr, "No space left on device") {
		t.Fatalf("a write past the volume's size: %+v", full)
	}
	esc := execAs(ctx, t, c, "root", "ln -s / /data/root; ls /data/root/ /data/../; cat /data/root/outside /data/root/../outside")
	if strings.Contains(esc.stdout, "secret") || strings.Contains(esc.stdout, "outside") {
		t.Fatalf("the guest reached beyond the shared directory: %+v", esc)
	}
	if ents, _ := os.ReadDir(filepath.Join(spec.Dir, "control")); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "vfs") {
				t.Fatalf("a volume's rendezvous socket stayed: %s", e.Name())
			}
		}
	}
}

// execAs runs script with sh -c as user in the guest, whatever its exit code.
func execAs(ctx context.Context, t *testing.T, c *control.Client, user, script string) execResult {
	t.Helper()
	return execGuest(ctx, t, c, control.ExecRequest{Argv: []string{"sh", "-c", script}, User: user})
}

// TestQEMUArgsWithVolumes checks QEMU's command line for a launch with volumes: its RAM is a
// shared memfd (vhost-user maps it), and each volume is a vhost-user-fs device on its own
// descriptor from FSFirstFD with its tag; a launch without volumes keeps the plain machine
// and RAM, which its memory generations were saved with.
func TestQEMUArgsWithVolumes(t *testing.T) {
	t.Parallel()
	cfg := shim.Config{Spec: runtime.Spec{Resources: runtime.Resources{VCPUs: 1, MemoryMB: 256}}, QEMU: "qemu", Accel: "tcg",
		Kernel: "/k", Initramfs: "/i", Overlay: "/o"}
	plain := strings.Join(shim.QEMUArgs(&cfg, false), " ")
	for _, no := range []string{"memory-backend", "vhost-user-fs", "memfd"} {
		if strings.Contains(plain, no) {
			t.Errorf("a launch without volumes has %q: %s", no, plain)
		}
	}
	cfg.Spec.Volumes = []runtime.VolumeMount{{Source: "/v/a", Target: "/data"}, {Source: "/v/b", Target: "/ro", ReadOnly: true}}
	args := strings.Join(shim.QEMUArgs(&cfg, false), " ")
	for _, want := range []string{
		"-M microvm,pcie=on,pit=on,pic=on,rtc=on,memory-backend=ram ",
		"-object memory-backend-memfd,id=ram,share=on,size=256M",
		"-chardev socket,id=fs0,fd=6 -device vhost-user-fs-pci,queue-size=1024,chardev=fs0,tag=bothyvol0",
		"-chardev socket,id=fs1,fd=7 -device vhost-user-fs-pci,queue-size=1024,chardev=fs1,tag=bothyvol1",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("QEMU's arguments lack %q: %s", want, args)
		}
	}
	if probe := strings.Join(shim.QEMUArgs(&cfg, true), " "); strings.Contains(probe, "vhost-user-fs") {
		t.Errorf("the probe's arguments have volumes: %s", probe)
	}
}
