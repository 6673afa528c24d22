package tests

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm"
)

// vmDeadline bounds each step that boots or reaches a microVM. Under TCG on a loaded 2-core
// host a cold start (the host base disk made once per state root, the accelerator probe, the
// boot) takes tens of seconds; the bound is for a hung VM, not a measure of speed.
const vmDeadline = 5 * time.Minute

// TestMicroVM drives one microVM through the API: /v1/info lists the microvm runtime (probing,
// then ready with its accelerator); a create with runtime microvm starts it; an exec shows the
// guest's own kernel, not the host's; a file written is read back; a SIGKILL of bothyd
// leaves it running and the restarted bothyd reattaches it (exec works, the file is
// there); bothyd check is clean beside it; stop and delete leave no microVM process.
// requireMicroVM returns the microvm runtime as the tests look at it, or skips tb where
// microVMs cannot run, saying what is missing.
func requireMicroVM(tb testing.TB) *microvm.Runtime {
	tb.Helper()
	vm, err := microvm.New(microvm.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	if why := vm.Refusal(); why != nil {
		tb.Skipf("microVMs cannot run on this host (scripts/setup installs qemu-system-x86, qemu-utils and linux-image-cloud-amd64): %v", why)
	}
	return vm
}

func TestMicroVM(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	guestKernel := newestCloudKernel(t)
	accel := vmAccel()
	d := startDaemon(t, withArgs("--microvm-accel", accel))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })

	// The probe runs in the background: info answers at once, probing or already done.
	waitFor(t, vmDeadline, "the microvm runtime's probe", func() bool {
		return microvmStatus(t, d).State != "probing"
	})
	st := microvmStatus(t, d)
	if st.State != "ready" || (st.Accelerator != "kvm" && st.Accelerator != "tcg") || st.Default || st.Identity == "" ||
		st.AcceleratorMode != accel || (accel != "auto" && st.Accelerator != accel) {
		t.Fatalf("the microvm runtime after its probe under --microvm-accel %s: %+v", accel, st)
	}

	const id = "vm1"
	r := d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
		"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256},
	}))
	sb := decode[struct {
		State   string `json:"state"`
		Runtime string `json:"runtime"`
	}](t, r, 201)
	t.Cleanup(func() {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
	})
	if sb.State != "running" || sb.Runtime != "microvm" {
		t.Fatalf("the created microVM: %+v", sb)
	}

	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	got := d.vmExec(id, "uname", "-r")
	if got != guestKernel || got == unix.ByteSliceToString(host.Release[:]) {
		t.Fatalf("uname -r in the microVM reads %q; want the guest kernel %q, not the host's %q",
			got, guestKernel, unix.ByteSliceToString(host.Release[:]))
	}

	// A live exec stream: stdin in, stdout and stderr out, the exit code at the end.
	ws, _, err := d.dialStream(id, url.Values{"command": {"sh"}})
	if err != nil {
		t.Fatalf("an exec stream into the microVM: %v", err)
	}
	ws.send("echo streamed $(uname -r); echo oops >&2; exit 5\n")
	if exit := ws.wait(); exit.ExitCode != 5 || ws.stdout.String() != "streamed "+guestKernel+"\n" || ws.stderr.String() != "oops\n" {
		t.Fatalf("the stream in the microVM: exit %+v, stdout %q, stderr %q", exit, ws.stdout.String(), ws.stderr.String())
	}

	content := []byte("written into a microVM\n")
	if r := d.vmDo("PUT", "/v1/sandboxes/"+id+"/files?path=/home/user/vm.txt", bytes.NewReader(content)); r.Status != 200 && r.Status != 201 && r.Status != 204 {
		t.Fatalf("writing a file: %d %s", r.Status, r.Body)
	}
	if r := d.vmDo("GET", "/v1/sandboxes/"+id+"/files?path=/home/user/vm.txt", nil); r.Status != 200 || !bytes.Equal(r.Body, content) {
		t.Fatalf("reading the file back: %d %q", r.Status, r.Body)
	}

	before, err := vm.Processes(d.Root)
	if err != nil || len(before) == 0 {
		t.Fatalf("the microVM's runtime processes: %+v, %v", before, err)
	}
	d.Restart(true)
	if r := d.vmDo("GET", "/v1/sandboxes/"+id, nil); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"running"`) {
		t.Fatalf("after a SIGKILL of bothyd and a restart: %d %s", r.Status, r.Body)
	}
	if got := d.vmExec(id, "cat", "/home/user/vm.txt"); got+"\n" != string(content) {
		t.Fatalf("the file after the restart reads %q", got)
	}
	after, err := vm.Processes(d.Root)
	if err != nil || !sameProcesses(before, after) {
		t.Fatalf("runtime processes before the restart %+v, after %+v (%v)", before, after, err)
	}

	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK || rep.Running != 1 {
		t.Fatalf("bothyd check beside a running microVM exited %d: %+v\n%s", code, rep, stderr)
	}

	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"stopped"`) {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	if left, err := vm.Processes(d.Root); err != nil || len(left) != 0 {
		t.Fatalf("microVM processes after the delete: %+v, %v", left, err)
	}
	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check after the delete exited %d: %+v\n%s", code, rep, stderr)
	}
}

// TestMicroVMRefusals: what a microVM cannot have yet is refused before anything starts, with
// the reason: a network, a clone, and (with --runtimes namespace) the runtime itself. It boots
// no VM.
func TestMicroVMRefusals(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--runtimes", "namespace"))
	info := decode[struct {
		Runtimes []runtimeStatusJSON `json:"runtimes"`
	}](t, d.do("GET", "/v1/info", nil, nil), 200)
	if len(info.Runtimes) != 2 || info.Runtimes[0].Kind != "namespace" || !info.Runtimes[0].Default || info.Runtimes[0].State != "ready" ||
		info.Runtimes[1].Kind != "microvm" || info.Runtimes[1].State != "unavailable" || info.Runtimes[1].Reason == "" {
		t.Fatalf("runtimes with --runtimes namespace: %+v", info.Runtimes)
	}
	p := wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "vm2", "runtime": "microvm", "start": true}), 503, "unavailable")
	if !strings.Contains(p.Detail, "microvm") {
		t.Fatalf("the refusal does not name the runtime: %s", p.Detail)
	}
	if r := d.do("GET", "/v1/sandboxes/vm2", nil, nil); r.Status != 404 {
		t.Fatalf("a refused create left a sandbox: %d %s", r.Status, r.Body)
	}
}

type runtimeStatusJSON struct {
	Kind            string `json:"kind"`
	Default         bool   `json:"default"`
	State           string `json:"state"`
	Accelerator     string `json:"accelerator"`
	AcceleratorMode string `json:"accelerator_mode"`
	Reason          string `json:"reason"`
	Identity        string `json:"identity"`
}

// vmAccel is the --microvm-accel the tests' microVMs run with: BOTHY_MICROVM_ACCEL if set
// (auto or kvm on a host with working KVM), else tcg, so that a server start does not spend
// the probe's timeout where nested KVM stalls a guest (here QEMU aborts under KVM at once).
func vmAccel() string {
	if a := os.Getenv("BOTHY_MICROVM_ACCEL"); a != "" {
		return a
	}
	return microvm.AccelTCG
}

// startVMDaemon starts bothyd with the microVM runtime (on vmAccel's accelerator), its
// leftover VMs reaped at the end, and waits for the runtime's probe: the test is skipped
// unless the runtime is ready.
func startVMDaemon(t testing.TB, vm *microvm.Runtime, opts ...daemonOption) *daemon {
	t.Helper()
	d := startDaemon(t, append(opts, withArgs("--microvm-accel", vmAccel()))...)
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	waitFor(t, vmDeadline, "the microvm runtime's probe", func() bool { return microvmStatus(t, d).State != "probing" })
	if st := microvmStatus(t, d); st.State != "ready" {
		t.Skipf("the microvm runtime is not ready here: %+v", st)
	}
	return d
}

// microvmStatus is the microvm runtime's entry of /v1/info.
func microvmStatus(t testing.TB, d *daemon) runtimeStatusJSON {
	t.Helper()
	info := decode[struct {
		Runtimes []runtimeStatusJSON `json:"runtimes"`
	}](t, d.do("GET", "/v1/info", nil, nil), 200)
	for _, r := range info.Runtimes {
		if r.Kind == "microvm" {
			return r
		}
	}
	t.Fatalf("/v1/info lists no microvm runtime: %+v", info.Runtimes)
	return runtimeStatusJSON{}
}

// vmDo is [daemon.do] with a deadline long enough for a microVM under TCG.
func (d *daemon) vmDo(method, path string, body io.Reader) response {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), vmDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, d.URL+path, body)
	if err != nil {
		d.t.Fatal(err)
	}
	if d.Token != "" {
		req.Header.Set("Authorization", "Bearer "+d.Token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		if strings.Contains(path, "/files") {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
	}
	resp, err := d.checkedClient(nil).Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// vmExec runs argv in the microVM and returns its stdout without the trailing newline; it
// fails the test unless the command exits 0.
func (d *daemon) vmExec(id string, argv ...string) string {
	d.t.Helper()
	res := decode[execJSON](d.t, d.vmDo("POST", "/v1/sandboxes/"+id+"/exec", jsonBody(d.t, map[string]any{"command": argv})), 200)
	if res.ExitCode != 0 {
		d.t.Fatalf("exec %q in %s: %+v", argv, id, res)
	}
	return strings.TrimSuffix(res.Stdout, "\n")
}

func jsonBody(t testing.TB, v any) io.Reader {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// newestCloudKernel is the release of the guest kernel that the runtime boots by default.
func newestCloudKernel(t *testing.T) string {
	t.Helper()
	k, _ := filepath.Glob("/boot/vmlinuz-*-cloud-amd64")
	if len(k) == 0 {
		t.Skip("no /boot/vmlinuz-*-cloud-amd64: scripts/setup installs linux-image-cloud-amd64")
	}
	sort.Strings(k)
	return strings.TrimPrefix(filepath.Base(k[len(k)-1]), "vmlinuz-")
}

// sameProcesses reports whether two listings name the same processes.
func sameProcesses(a, b []runtime.Process) bool {
	key := func(ps []runtime.Process) string {
		var s []string
		for _, p := range ps {
			s = append(s, p.ID.String()+" "+string(p.Role)+" "+p.Dir)
		}
		sort.Strings(s)
		return strings.Join(s, "\n")
	}
	return key(a) == key(b)
}

// reapMicroVMs ends any microVM left under root by a test that failed half-way: a microVM
// outlives bothyd by design.
func reapMicroVMs(t testing.TB, vm *microvm.Runtime, root string) {
	procs, err := vm.Processes(root)
	if err != nil {
		t.Logf("listing the microVMs left under %s: %v", root, err)
		return
	}
	for _, p := range procs {
		if err := platform.SignalVerified(p.ID, syscall.SIGKILL); err != nil {
			t.Logf("killing a left-over microVM process %s: %v", p.ID, err)
		}
	}
}

// TestMicroVMCheckFindsAndRepairs: bothyd check knows what a microVM leaves behind, and
// --repair removes it: a QEMU whose shim is gone (here one started by the test, paused, naming
// a sandbox's overlay as a microVM's does), the control socket of a microVM that does not run,
// the initramfs of an older guest stack, a half-made base disk of a crashed build, and a base
// disk of an older host that nothing backs onto. A base disk that a sandbox's overlay backs
// onto stays (or a template generation's frozen disk: TestStaleBaseDisks), as does one made
// less than 10 min ago (a start may be about to make its overlay over it), and an initramfs
// that a live QEMU names, until that QEMU is gone. It boots no VM.
func TestMicroVMCheckFindsAndRepairs(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	d := startDaemon(t, withArgs("--microvm-accel", microvm.AccelTCG))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	const id = "vmleft"
	decode[struct{}](t, d.vmDo("POST", "/v1/sandboxes", jsonBody(t, map[string]any{"id": id, "runtime": "microvm"})), 201)
	d.Stop()
	dir := filepath.Join(d.Root, "sandboxes", id)

	base := filepath.Join(d.Root, "images", ".host")
	if err := os.MkdirAll(base, 0o700); err != nil {
		t.Fatal(err)
	}
	oldInitrd := filepath.Join(base, "microvm-initramfs-00000000000000aa.cpio")
	usedInitrd := filepath.Join(base, "microvm-initramfs-00000000000000bb.cpio")
	oldBase := filepath.Join(base, "microvm-host-00000000000000cc.ext4")
	backingBase := filepath.Join(base, "microvm-host-00000000000000ee.ext4")
	youngBase := filepath.Join(base, "microvm-image-0000000000000011.ext4")
	halfMade := filepath.Join(base, platform.TempName("microvm-host-00000000000000dd.ext4"))
	for _, f := range []string{oldInitrd, usedInitrd, oldBase, backingBase, youngBase, halfMade} {
		if err := os.WriteFile(f, make([]byte, 512), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The overlay a start made (over an older host's base disk, which must therefore stay
	// unremarked), and a QEMU of it that outlived its shim.
	overlay := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", backingBase, overlay, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	hourAgo := time.Now().Add(-time.Hour)
	for _, f := range []string{halfMade, oldBase, backingBase} {
		if err := os.Chtimes(f, hourAgo, hourAgo); err != nil {
			t.Fatal(err)
		}
	}
	qemu := exec.Command("qemu-system-x86_64", "-M", "none", "-S", "-nodefaults", "-no-user-config", "-display", "none",
		"-drive", "if=none,id=root,format=qcow2,file="+overlay,
		"-drive", "if=none,id=keep,format=raw,readonly=on,file="+usedInitrd)
	qemu.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	qemuDone := make(chan struct{})
	go func() { _ = qemu.Wait(); close(qemuDone) }()
	t.Cleanup(func() { _ = qemu.Process.Kill(); <-qemuDone })
	waitFor(t, 30*time.Second, "the orphan QEMU among the microvm runtime's processes", func() bool {
		procs, err := vm.Processes(d.Root)
		return err == nil && len(procs) == 1 && procs[0].Role == runtime.RoleInit && procs[0].Dir == dir && procs[0].ID.Pid == qemu.Process.Pid
	})

	// The control socket of a microVM whose shim is gone.
	sock := filepath.Join(dir, "control", "control.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	rel := func(p string) string { r, _ := filepath.Rel(d.Root, p); return r }
	r, code, stderr := runCheck(t, d.Root)
	if code != 1 || r.OK {
		t.Fatalf("check of a root with microVM leftovers exited %d: %+v\n%s", code, r, stderr)
	}
	got := map[string]bool{}
	for _, p := range r.Problems {
		got[p.Kind+" "+p.Entry] = true
	}
	want := []string{"unrecorded-process sandboxes/" + id, "leaked-runtime-file sandboxes/" + id + "/control/control.sock",
		"stale-shared-file " + rel(oldInitrd), "stale-shared-file " + rel(halfMade), "stale-shared-file " + rel(oldBase)}
	for _, w := range want {
		if !got[w] {
			t.Errorf("check did not report %q", w)
		}
	}
	if len(r.Problems) != len(want) {
		t.Errorf("check reported %d problems, want %d: %+v", len(r.Problems), len(want), r.Problems)
	}
	for _, n := range r.Notes {
		if n.Kind == "stale-shared-file" {
			t.Errorf("check noted %s: %s", n.Entry, n.Detail)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	r, code, stderr = runCheck(t, d.Root, "--repair")
	if code != 0 {
		t.Fatalf("repair exited %d: %+v\n%s", code, r, stderr)
	}
	for _, p := range r.Problems {
		if !p.Repaired {
			t.Errorf("not repaired: %+v", p)
		}
	}
	select {
	case <-qemuDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the orphan QEMU survived the repair")
	}
	for _, f := range []string{sock, oldInitrd, halfMade, usedInitrd, oldBase} {
		if _, err := os.Lstat(f); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after the repair: %v", rel(f), err)
		}
	}
	for _, f := range []string{backingBase, youngBase, overlay} {
		if _, err := os.Lstat(f); err != nil {
			t.Errorf("the repair removed %s: %v", rel(f), err)
		}
	}
	if r, code, stderr := runCheck(t, d.Root); code != 0 || !r.OK {
		t.Fatalf("check after the repair exited %d: %+v\n%s", code, r, stderr)
	}
}

// microvmImage is a two-layer image of the host's static busybox whose upper layer uses what
// the base disk's merge must get right: a whiteout (/gone.txt), an opaque directory (/opq:
// only b, not the lower a), and a directory /esc where the lower layer has a symbolic link
// to outside, a host directory: the directory hides the link, and nothing is written through it.
func microvmImage(t *testing.T, outside string) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("the microVM image test needs a static busybox at /bin/busybox: run scripts/setup (busybox-static)")
	}
	entry := func(tw *tar.Writer, h *tar.Header, body []byte) {
		h.ModTime = time.Unix(0, 0)
		if body != nil {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if body != nil {
			_, _ = tw.Write(body)
		}
	}
	base := tarLayer(t, func(tw *tar.Writer) {
		entry(tw, &tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
		entry(tw, &tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, bb)
		for _, p := range append([]string{"df", "uname"}, busyboxPrograms...) {
			entry(tw, &tar.Header{Name: "bin/" + p, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
		}
		entry(tw, &tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
		entry(tw, &tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:0:root:/root:/bin/sh\n"))
		entry(tw, &tar.Header{Name: "gone.txt", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("whited out\n"))
		entry(tw, &tar.Header{Name: "opq/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
		entry(tw, &tar.Header{Name: "opq/a", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("hidden\n"))
		entry(tw, &tar.Header{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: outside, Mode: 0o777}, nil)
	})
	top := tarLayer(t, func(tw *tar.Writer) {
		entry(tw, &tar.Header{Name: ".wh.gone.txt", Typeflag: tar.TypeReg, Mode: 0o644}, []byte{})
		entry(tw, &tar.Header{Name: "opq/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
		entry(tw, &tar.Header{Name: "opq/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o644}, []byte{})
		entry(tw, &tar.Header{Name: "opq/b", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("upper\n"))
		entry(tw, &tar.Header{Name: "esc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
		entry(tw, &tar.Header{Name: "esc/x", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("in the image\n"))
	})
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", hostArch()
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestMicroVMImage runs microVMs on an OCI image: the image's layers, merged as overlayfs
// shows them (whiteout, opaque directory, a directory over a link), are the root disk; the
// sandbox's disk_mb is its room beyond the image (the guest grows its file system into it at
// boot); a second microVM of the image shares the one base disk; nothing is written through
// a link of the image onto the host; bothyd check stays clean. The base disk stays while a
// generation's disk backs onto it, and once nothing does, the repair removes it and the next
// microVM makes it again.
func TestMicroVMImage(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	guestKernel := newestCloudKernel(t)
	outside := t.TempDir()
	img := microvmImage(t, outside)
	d := startDaemon(t, withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	d.importImage("vmimg", dockerSave(t, img))

	const diskMB = 256
	for _, id := range []string{"vmimg1", "vmimg2"} {
		r := d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
			"id": id, "runtime": "microvm", "image": "vmimg", "start": true,
			"resources": map[string]any{"memory_mb": 256, "disk_mb": diskMB},
		}))
		if sb := decode[struct {
			State string `json:"state"`
		}](t, r, 201); sb.State != "running" {
			t.Fatalf("%s: %+v", id, sb)
		}
		t.Cleanup(func() {
			d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
			d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
		})
		if got := d.vmExec(id, "uname", "-r"); got != guestKernel {
			t.Fatalf("uname -r in %s: %q, want the guest's %q", id, got, guestKernel)
		}
		if got := d.vmExec(id, "cat", "/esc/x"); got != "in the image" {
			t.Fatalf("/esc/x in %s: %q", id, got)
		}
	}
	const id = "vmimg1"
	if got := d.vmExec(id, "ls", "/opq"); got != "b" {
		t.Errorf("the opaque directory lists %q, want only the upper layer's b", got)
	}
	res := decode[execJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/exec", jsonBody(t, map[string]any{"command": []string{"cat", "/gone.txt"}})), 200)
	if res.ExitCode == 0 {
		t.Errorf("the whited-out /gone.txt reads %q", res.Stdout)
	}
	// busybox df -k /: "Filesystem 1K-blocks Used Available Use% Mounted on" and one line.
	df := strings.Fields(d.vmExec(id, "df", "-k", "/"))
	if len(df) < 8 {
		t.Fatalf("df -k / printed %q", df)
	}
	total, err := strconv.Atoi(df[len(df)-5])
	if err != nil {
		t.Fatalf("df -k / printed %q: %v", df, err)
	}
	t.Logf("the root file system of a microVM on the image with disk_mb %d: %d KiB", diskMB, total)
	if total < diskMB*1024*9/10 || total > (diskMB+200)*1024 {
		t.Errorf("the root file system has %d KiB; want about the image plus disk_mb %d MiB (the guest grows it)", total, diskMB)
	}
	content := []byte("the sandbox's own file\n")
	if r := d.vmDo("PUT", "/v1/sandboxes/"+id+"/files?path=/home/user/own.txt", bytes.NewReader(content)); r.Status/100 != 2 {
		t.Fatalf("writing a file: %d %s", r.Status, r.Body)
	}
	if got := d.vmExec(id, "cat", "/home/user/own.txt"); got+"\n" != string(content) {
		t.Fatalf("the file reads %q", got)
	}
	if ents, err := os.ReadDir(outside); err != nil || len(ents) != 0 {
		t.Fatalf("the host directory the image's link names holds %v (%v): written through the link", ents, err)
	}
	bases, _ := filepath.Glob(filepath.Join(d.Root, "images", ".host", "microvm-image-*.ext4"))
	if len(bases) != 1 {
		t.Fatalf("base disks of the image: %v, want exactly one shared by both microVMs", bases)
	}
	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK || rep.Running != 2 {
		t.Fatalf("bothyd check beside two microVMs of an image exited %d: %+v\n%s", code, rep, stderr)
	}

	// The base disk stays while a generation's frozen disk backs onto it, its sandboxes gone;
	// then, unused (and made long enough ago that no start can be about to make its overlay
	// over it), it is stale, the repair removes it, and the next microVM of the image makes it
	// again.
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(bases[0], old, old); err != nil {
		t.Fatal(err)
	}
	d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": "vmimgt"})
	g := decode[generationJSON](t, d.vmDo("POST", "/v1/templates/vmimgt/generations?timeout=600000", jsonBody(t, map[string]any{"sandbox": "vmimg2"})), 201)
	for _, id := range []string{"vmimg1", "vmimg2"} {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check with the image's base disk under a generation only exited %d: %+v\n%s", code, rep, stderr)
	}
	if r := d.vmDo("DELETE", "/v1/templates/vmimgt/generations/"+g.ID, nil); r.Status != 204 {
		t.Fatalf("delete the generation: %d %s", r.Status, r.Body)
	}
	rel, _ := filepath.Rel(d.Root, bases[0])
	rep, code, stderr := runCheck(t, d.Root)
	if code != 1 || len(rep.Problems) != 1 || rep.Problems[0].Kind != "stale-shared-file" || rep.Problems[0].Entry != rel {
		t.Fatalf("bothyd check with an unused base disk exited %d: %+v; want %s stale\n%s", code, rep, rel, stderr)
	}
	if rep, code, stderr := runCheck(t, d.Root, "--repair"); code != 0 {
		t.Fatalf("repair exited %d: %+v\n%s", code, rep, stderr)
	}
	if _, err := os.Lstat(bases[0]); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the unused base disk after the repair: %v", err)
	}
	d.createVM(map[string]any{"id": "vmimg3", "runtime": "microvm", "image": "vmimg", "start": true, "resources": map[string]any{"memory_mb": 256}})
	if got := d.vmExec("vmimg3", "cat", "/esc/x"); got != "in the image" {
		t.Fatalf("/esc/x in a microVM of the image after the repair: %q", got)
	}
	if _, err := os.Lstat(bases[0]); err != nil {
		t.Fatalf("the base disk made again: %v", err)
	}
	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check at the end exited %d: %+v\n%s", code, rep, stderr)
	}
}

// TestMicroVMPolicyOfNothingIsTaken: a network policy that allows nothing is no network, and a
// microVM create with it is taken. It boots no VM (TestMicroVMNetwork boots a networked one;
// tests/microvm_memory_test.go clones).
func TestMicroVMPolicyOfNothingIsTaken(t *testing.T) {
	requireRoot(t)
	requireMicroVM(t)
	t.Parallel()
	d := startDaemon(t, withArgs("--microvm-accel", microvm.AccelTCG))
	decode[struct{}](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "vmquiet", "runtime": "microvm", "network": map[string]any{"internet": false}}), 201)
	t.Cleanup(func() { d.do("DELETE", "/v1/sandboxes/vmquiet", nil, nil) })
}

// TestMicroVMKilledMidLaunch SIGKILLs the real bothyd while a microVM's start is under way
// (its shim runs, the guest boots, the control socket is not there yet) and starts bothyd
// again: the restart ends the interrupted launch (no shim or QEMU is left, bothyd check is
// clean), and the sandbox starts again with the file it had written before (nothing lost).
func TestMicroVMKilledMidLaunch(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	d := startDaemon(t, withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	const id = "vmmid"
	decode[struct{}](t, d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
		"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256},
	})), 201)
	t.Cleanup(func() {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
	})
	content := []byte("written before the crash\n")
	if r := d.vmDo("PUT", "/v1/sandboxes/"+id+"/files?path=/home/user/kept.txt", bytes.NewReader(content)); r.Status/100 != 2 {
		t.Fatalf("writing a file: %d %s", r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}

	// The start, from a client that the crash cuts off.
	url, token := d.URL, d.Token
	go func() {
		req, err := http.NewRequest("POST", url+"/v1/sandboxes/"+id+"/start?timeout=600000", nil)
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	dir := filepath.Join(d.Root, "sandboxes", id)
	sock := filepath.Join(dir, "control", "control.sock")
	var beforeSocket bool
	waitFor(t, vmDeadline, "the microVM's shim", func() bool {
		procs, err := vm.Processes(d.Root)
		if err != nil {
			return false
		}
		for _, p := range procs {
			if p.Role == runtime.RoleShim && p.Dir == dir {
				_, serr := os.Lstat(sock)
				beforeSocket = serr != nil
				return true
			}
		}
		return false
	})
	d.Kill()
	if !beforeSocket {
		t.Log("the control socket was there already when bothyd was killed: the guest booted faster than the test looked")
	}
	if procs, _ := vm.Processes(d.Root); len(procs) == 0 {
		t.Fatal("the microVM did not outlive bothyd's SIGKILL: the test shows nothing")
	}

	d.start()
	sb := decode[struct {
		State string `json:"state"`
	}](t, d.vmDo("GET", "/v1/sandboxes/"+id, nil), 200)
	if sb.State == "running" || sb.State == "starting" {
		t.Fatalf("the interrupted start reads %s after the restart, want it ended", sb.State)
	}
	if procs, err := vm.Processes(d.Root); err != nil || len(procs) != 0 {
		t.Fatalf("microVM processes after the restart ended the interrupted start: %+v, %v", procs, err)
	}
	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check after the restart exited %d: %+v\n%s", code, rep, stderr)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start after the restart: %d %s", r.Status, r.Body)
	}
	if got := d.vmExec(id, "cat", "/home/user/kept.txt"); got+"\n" != string(content) {
		t.Fatalf("the file written before the crash reads %q", got)
	}
}
