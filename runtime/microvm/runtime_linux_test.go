//go:build linux

package microvm

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

func testSpec(t *testing.T, id string) runtime.Spec {
	root := filepath.Join(t.TempDir(), "root")
	dir := filepath.Join(root, "sandboxes", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return runtime.Spec{ID: id, Dir: dir, LaunchID: "launch-1", Image: "host", HostBase: sharedAssets,
		Capability: []byte("secret-" + id), Resources: runtime.Resources{MemoryMB: 256}}
}

func hostRelease(t *testing.T) string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	return unix.ByteSliceToString(u.Release[:])
}

// TestIdentityRecordsTheGuestStack checks that the identity names QEMU's version, the kernel's
// release and the initramfs's hash, and that another initramfs is another identity.
func TestIdentityRecordsTheGuestStack(t *testing.T) {
	r := newRuntime(t)
	v, err := r.Versions()
	if err != nil {
		t.Fatal(err)
	}
	id := r.Identity()
	for _, part := range []string{"qemu-" + v.QEMU, "kernel-" + v.Kernel, "initramfs-" + v.Initramfs} {
		if !strings.Contains(id, "/"+part+"/") {
			t.Errorf("identity %q lacks %q", id, part)
		}
	}
	if !strings.HasPrefix(v.Kernel, kernelRelease(r.cfg.Kernel)+"+") || v.QEMU == "" || len(v.Initramfs) != 16 {
		t.Errorf("versions %+v", v)
	}
	other := v
	other.Initramfs = strings.Repeat("0", 16)
	if identityOf(other, "x") == identityOf(v, "x") {
		t.Error("another initramfs gives the same identity")
	}
}

// TestProbeGuestAnswers boots the accelerator probe's guest under TCG, which must answer, and
// checks that a probe out of time fails rather than hangs.
func TestProbeGuestAnswers(t *testing.T) {
	r := newRuntime(t)
	ctx := vmContext(t)
	start := time.Now()
	if err := r.bootProbe(ctx, "tcg"); err != nil {
		t.Fatalf("the probe guest did not answer under TCG: %v", err)
	}
	t.Logf("TCG probe guest: boot to first answer %v", time.Since(start))
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := r.bootProbe(short, "tcg"); err == nil {
		t.Fatal("a probe given 50 ms answered: no guest boots that fast under TCG")
	}
	if accel, err := r.Probe(); err != nil || accel != "tcg" {
		t.Fatalf("Probe with the accelerator forced to tcg: %q, %v", accel, err)
	}
}

// TestAcceleratorChoice: the operator's choice decides the probe without a probe guest where
// it can: tcg never looks at KVM; kvm takes a KVM device that opens and makes the runtime
// unavailable, saying why, where none does; auto without a KVM device is tcg at once. A choice
// that is none of these is refused by New. No guest boots.
func TestAcceleratorChoice(t *testing.T) {
	newRuntime(t) // skips where microVMs cannot run
	if _, err := New(Config{Accel: "xen"}); err == nil {
		t.Fatal("New took the accelerator xen")
	}
	dev := filepath.Join(t.TempDir(), "kvm")
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "no-kvm")
	for _, c := range []struct {
		accel, device, want string
		unavailable         bool
	}{
		{"tcg", missing, "tcg", false},
		{"", missing, "tcg", false},
		{"auto", missing, "tcg", false},
		{"kvm", dev, "kvm", false},
		{"kvm", missing, "", true},
	} {
		r, err := New(Config{Accel: c.accel, KVMDevice: c.device, ProbeTimeout: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		if c.accel == "" && r.AccelMode() != AccelAuto || c.accel != "" && r.AccelMode() != c.accel {
			t.Errorf("accel %q: mode %q", c.accel, r.AccelMode())
		}
		got, err := r.Probe()
		if c.unavailable {
			if errcode.Of(err) != errcode.Unavailable || !strings.Contains(err.Error(), missing) {
				t.Errorf("accel %q without a KVM device: %q, %v; want unavailable naming the device", c.accel, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("accel %q, device %s: %q, %v; want %q", c.accel, c.device, got, err, c.want)
		}
	}
}

// TestQEMUArgsByAccelerator: under KVM QEMU gets the host's CPU and no TSC frequency on the
// kernel's command line (kvmclock is the guest's clock); under TCG the emulated max CPU and
// the host's TSC frequency, without which the boot hangs on a loaded host.
func TestQEMUArgsByAccelerator(t *testing.T) {
	args := func(accel string) string {
		cfg := &shim.Config{Accel: accel, QEMU: "qemu", Kernel: "k", Initramfs: "i", Overlay: "o", TSCkHz: 2000000,
			Spec: runtime.Spec{Resources: runtime.Resources{VCPUs: 2, MemoryMB: 256}}}
		return strings.Join(shim.QEMUArgs(cfg, false), " ")
	}
	kvm, tcg := args("kvm"), args("tcg")
	for _, want := range []string{"-accel kvm", "-cpu host", "-smp 2", "-m 256"} {
		if !strings.Contains(kvm, want) {
			t.Errorf("KVM's QEMU arguments lack %q: %s", want, kvm)
		}
	}
	if strings.Contains(kvm, "tsc_early_khz") || strings.Contains(kvm, "-cpu max") {
		t.Errorf("KVM's QEMU arguments carry TCG's: %s", kvm)
	}
	for _, want := range []string{"-accel tcg", "-cpu max", "tsc_early_khz=2000000 tsc=reliable"} {
		if !strings.Contains(tcg, want) {
			t.Errorf("TCG's QEMU arguments lack %q: %s", want, tcg)
		}
	}
}

// TestKillOfTheShimLeavesNothing SIGKILLs a running microVM's shim: QEMU dies with it, no
// runtime process is left, and Cleanup leaves no control socket.
func TestKillOfTheShimLeavesNothing(t *testing.T) {
	r := newRuntime(t)
	ctx := vmContext(t)
	spec := testSpec(t, "killed")
	proc, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	c := dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability)
	defer c.Close()
	root := filepath.Dir(filepath.Dir(spec.Dir))
	procs, err := r.Processes(root)
	if err != nil {
		t.Fatal(err)
	}
	var qemu platform.ProcessID
	for _, p := range procs {
		if p.Role == runtime.RoleInit && p.Dir == spec.Dir {
			qemu = p.ID
		}
	}
	if len(procs) != 2 || qemu.IsZero() {
		t.Fatalf("processes of a running microVM: %+v, want its shim and its QEMU", procs)
	}
	if err := platform.SignalVerified(proc, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := platform.WaitExit(ctx, proc); err != nil {
		t.Fatal(err)
	}
	if err := platform.WaitExit(ctx, qemu); err != nil {
		t.Fatalf("QEMU outlived its shim: %v", err)
	}
	if err := r.Cleanup(ctx, spec.ID, spec.Dir, proc); err != nil {
		t.Fatal(err)
	}
	if procs, err := r.Processes(root); err != nil || len(procs) != 0 {
		t.Fatalf("processes after the shim's SIGKILL and Cleanup: %+v, %v", procs, err)
	}
	if _, err := os.Lstat(r.ControlPath(spec.Dir)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the control socket is left: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(spec.Dir, runtime.OutcomeName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a killed shim wrote an outcome: %v", err)
	}
}

// TestStartExecStop boots a microVM, runs uname -r in it (the guest's kernel, not the
// host's), writes and reads a file, measures the exec round trip, and stops it gracefully
// (the agent shuts down and powers off); a second run finds the file on its disk and is
// killed by force.
func TestStartExecStop(t *testing.T) {
	r := newRuntime(t)
	ctx := vmContext(t)
	spec := testSpec(t, "vm")
	start := time.Now()
	proc, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	c := dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability)
	t.Logf("cold start to the agent's first answer (TCG, assets made before): %v", time.Since(start))
	out := run(ctx, t, c, "uname", "-r")
	release := strings.TrimSpace(out)
	if release == hostRelease(t) || release != kernelRelease(r.cfg.Kernel) {
		t.Fatalf("uname -r in the guest: %q; the host runs %q, the guest kernel is %q", release, hostRelease(t), kernelRelease(r.cfg.Kernel))
	}
	const n = 10
	t0 := time.Now()
	for range n {
		run(ctx, t, c, "true")
	}
	t.Logf("exec round trip of true (TCG): %v", time.Since(t0)/n)
	content := []byte("hello from the host\n")
	if _, err := c.WriteFile(ctx, control.WriteRequest{Path: "/home/user/hello.txt", User: control.User}, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if got := run(ctx, t, c, "cat", "/home/user/hello.txt"); got != string(content) {
		t.Fatalf("the file reads %q in the guest", got)
	}
	if err := c.Shutdown(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := platform.WaitExit(ctx, proc); err != nil {
		t.Fatal(err)
	}
	o := readOutcome(t, spec.Dir)
	if o.Reason != runtime.ReasonExited || o.ExitCode != 0 || o.LaunchID != spec.LaunchID {
		t.Fatalf("outcome of a graceful stop: %+v", o)
	}
	if err := r.Cleanup(ctx, spec.ID, spec.Dir, proc); err != nil {
		t.Fatal(err)
	}

	spec.LaunchID = "launch-2"
	proc, err = r.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	c = dialAgent(ctx, t, r, spec.Dir, proc, spec.Capability)
	defer c.Close()
	rc, _, err := c.ReadFile(ctx, "/home/user/hello.txt", control.User)
	if err != nil {
		t.Fatalf("the file of the first run: %v", err)
	}
	var got bytes.Buffer
	_, _ = got.ReadFrom(rc)
	rc.Close()
	if !bytes.Equal(got.Bytes(), content) {
		t.Fatalf("the file of the first run reads %q", got.Bytes())
	}
	if err := r.Kill(ctx, spec.Dir, proc); err != nil {
		t.Fatal(err)
	}
	if proc.Alive() {
		t.Fatal("the shim runs after Kill")
	}
	o = readOutcome(t, spec.Dir)
	if o.Reason != runtime.ReasonSignaled || o.Signal != "SIGKILL" || o.LaunchID != "launch-2" {
		t.Fatalf("outcome of a kill: %+v", o)
	}
	if err := r.Cleanup(ctx, spec.ID, spec.Dir, proc); err != nil {
		t.Fatal(err)
	}
}

// run runs argv in the guest and returns its stdout; it must exit 0.
func run(ctx context.Context, t *testing.T, c *control.Client, argv ...string) string {
	t.Helper()
	res := execGuest(ctx, t, c, control.ExecRequest{Argv: argv})
	if res.code != 0 {
		t.Fatalf("exec %q exited %d; stderr %q", argv, res.code, res.stderr)
	}
	return res.stdout
}

// execResult is an exec's end and output.
type execResult struct {
	code           int
	stdout, stderr string
}

// execGuest runs req in the guest and collects its output, whatever its exit code.
func execGuest(ctx context.Context, t *testing.T, c *control.Client, req control.ExecRequest) execResult {
	t.Helper()
	p, err := c.Exec(ctx, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	defer p.Close()
	var stdout, stderr bytes.Buffer
	buf := make([]byte, 32<<10)
	for {
		typ, n, err := p.ReadOutput(buf)
		if err != nil {
			break
		}
		if typ == control.FrameStderr {
			stderr.Write(buf[:n])
		} else {
			stdout.Write(buf[:n])
		}
	}
	st, err := p.Wait()
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return execResult{code: st.ExitCode, stdout: stdout.String(), stderr: stderr.String()}
}

func readOutcome(t *testing.T, dir string) runtime.Outcome {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, runtime.OutcomeName))
	if err != nil {
		t.Fatal(err)
	}
	var o runtime.Outcome
	if err := record.Decode(runtime.OutcomeName, b, runtime.OutcomeFormat, &o); err != nil {
		t.Fatal(err)
	}
	return o
}
