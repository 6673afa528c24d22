package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/platform"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/microvm"
)

// vmDeadline bounds each step that boots or reaches a microVM. Under TCG on a loaded 2-core
// host a cold start (the host base disk made once per state root, the accelerator probe, the
// boot) takes tens of seconds; the bound is for a hung VM, not a measure of speed.
const vmDeadline = 5 * time.Minute

// TestMicroVM drives one microVM through the API: /v1/info lists the microvm runtime (probing,
// then ready with its accelerator); a create with runtime microvm starts it; an exec shows the
// guest's own kernel, not the host's; a file written is read back; a SIGKILL of sandboxd
// leaves it running and the restarted sandboxd reattaches it (exec works, the file is
// there); sandboxd check is clean beside it; stop and delete leave no microVM process.
func TestMicroVM(t *testing.T) {
	requireRoot(t)
	vm, err := microvm.New(microvm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if why := vm.Refusal(); why != nil {
		t.Skipf("microVMs cannot run on this host (scripts/setup installs qemu-system-x86, qemu-utils and linux-image-cloud-amd64): %v", why)
	}
	guestKernel := newestCloudKernel(t)
	d := startDaemon(t)
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })

	// The probe runs in the background: info answers at once, probing or already done.
	waitFor(t, vmDeadline, "the microvm runtime's probe", func() bool {
		return microvmStatus(t, d).State != "probing"
	})
	st := microvmStatus(t, d)
	if st.State != "ready" || (st.Accelerator != "kvm" && st.Accelerator != "tcg") || st.Default || st.Identity == "" {
		t.Fatalf("the microvm runtime after its probe: %+v", st)
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
		t.Fatalf("after a SIGKILL of sandboxd and a restart: %d %s", r.Status, r.Body)
	}
	if got := d.vmExec(id, "cat", "/home/user/vm.txt"); got+"\n" != string(content) {
		t.Fatalf("the file after the restart reads %q", got)
	}
	after, err := vm.Processes(d.Root)
	if err != nil || !sameProcesses(before, after) {
		t.Fatalf("runtime processes before the restart %+v, after %+v (%v)", before, after, err)
	}

	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK || rep.Running != 1 {
		t.Fatalf("sandboxd check beside a running microVM exited %d: %+v\n%s", code, rep, stderr)
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
		t.Fatalf("sandboxd check after the delete exited %d: %+v\n%s", code, rep, stderr)
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
	Kind        string `json:"kind"`
	Default     bool   `json:"default"`
	State       string `json:"state"`
	Accelerator string `json:"accelerator"`
	Reason      string `json:"reason"`
	Identity    string `json:"identity"`
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
	resp, err := (&http.Client{}).Do(req)
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
// outlives sandboxd by design.
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
