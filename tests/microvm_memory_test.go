package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm"
)

// vmCounter starts, detached in the guest, a shell loop that counts in memory and writes each
// count to /dev/shm/count (a tmpfs: nothing but the VM's memory holds it) and its pid to
// /dev/shm/pid. Only a restore of the VM's memory carries it into a clone. Each count is
// renamed into place: a reader of a file rewritten in place could find it empty.
const vmCounter = `setsid sh -c 'echo $$ > /dev/shm/pid; i=0; while :; do i=$((i+1)); echo $i > /dev/shm/count.new; mv -f /dev/shm/count.new /dev/shm/count; sleep 0.2; done' </dev/null >/dev/null 2>&1 &`

// TestMicroVMMemoryTemplate captures a running microVM with a counter in its memory and clones
// it twice: in each clone the counter's process runs on, with its pid, counting on from the
// count at the capture, under the clone's own host name and machine id, its clock reading the
// host's. The source runs on
// after the capture. A generation made ineligible (its time contract read as early) is refused
// at the clone and at the start of a clone that holds it, before any QEMU starts. The
// generation's lease holds it until both clones are gone. A plain pause stops the VM and a
// resume lets it count on; a pause with the memory released ends QEMU, survives a SIGKILL of
// bothyd, and its resume restores the counter; a stop of a released VM discards its
// memory. A SIGKILL of bothyd while the capture holds the VM stopped leaves
// it running after the restart, with no generation and nothing for bothyd check to find.
func TestMicroVMMemoryTemplate(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	newestCloudKernel(t)
	d := startVMDaemon(t, vm)

	const src = "src"
	d.createVM(map[string]any{"id": src, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256}})
	d.vmExec(src, "sh", "-c", vmCounter)
	pid, before := d.vmWaitCount(src, 2)
	srcMachine := d.vmExec(src, "cat", "/etc/machine-id")

	if r := d.vmDo("POST", "/v1/templates", jsonBody(t, map[string]any{"name": "mem"})); r.Status != 201 {
		t.Fatalf("create template: %d %s", r.Status, r.Body)
	}
	g := decode[struct {
		generationJSON
		CapturePauseMS int64 `json:"capture_pause_ms"`
	}](t, d.vmDo("POST", "/v1/templates/mem/generations?timeout=600000", jsonBody(t, map[string]any{"sandbox": src})), 201)
	if g.State != "active" || g.Eligibility != "eligible" || g.CapturePauseMS <= 0 || g.SizeBytes <= 0 {
		t.Fatalf("the memory generation: %+v", g)
	}
	t.Logf("capture pause of a running 256 MiB microVM (TCG): %d ms, generation %d bytes", g.CapturePauseMS, g.SizeBytes)
	// The source runs on after its capture, its counter too.
	if p, _ := d.vmWaitCount(src, before+3); p != pid {
		t.Fatalf("the source's counter is pid %d after the capture, %d before", p, pid)
	}

	machines := map[string]string{src: srcMachine}
	for _, id := range []string{"c1", "c2"} {
		start := time.Now()
		sb := decode[cloneJSON](t, d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
			"id": id, "template": "mem", "runtime": "microvm", "start": true})), 201)
		t.Logf("clone %s: create and restore to running: %v", id, time.Since(start))
		if sb.State != "running" || sb.Template == nil || sb.Template.Generation != g.ID {
			t.Fatalf("the clone %s: %+v", id, sb)
		}
		cpid, first := d.vmReadCount(id)
		if cpid != pid || first < before {
			t.Fatalf("clone %s: counter pid %d at %d; the source's is pid %d, at %d before the capture", id, cpid, first, pid, before)
		}
		if p, _ := d.vmWaitCount(id, first+3); p != pid {
			t.Fatalf("clone %s: the counter's pid changed to %d", id, p)
		}
		if h := d.vmExec(id, "hostname"); h != id {
			t.Fatalf("clone %s has host name %q", id, h)
		}
		d.vmWantClock(id)
		m := d.vmExec(id, "cat", "/etc/machine-id")
		for other, om := range machines {
			if m == om || len(m) != 32 {
				t.Fatalf("clone %s has machine id %q, %s has %q", id, m, other, om)
			}
		}
		machines[id] = m
	}

	// A clone is not captured: its disk is changes over the generation's, which a new
	// generation would name as its backing file without holding the generation.
	wantProblem(t, d.vmDo("POST", "/v1/templates/mem/generations?timeout=600000", jsonBody(t, map[string]any{"sandbox": "c1"})), 501, "not-implemented")

	// Ineligible: the generation's time contract read as early (its monotonic reading moved
	// past the host's). A clone is refused, and so is the start of a clone made before.
	d.createVM(map[string]any{"id": "c3", "template": "mem", "runtime": "microvm"})
	index := filepath.Join(d.Root, "templates", "mem", g.ID, "index.json")
	orig, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	var entry map[string]any
	if err := json.Unmarshal(orig, &entry); err != nil {
		t.Fatal(err)
	}
	tc := entry["time"].(map[string]any)
	tc["monotonic_ns"] = tc["monotonic_ns"].(float64) + float64(1000*time.Hour)
	early, _ := json.Marshal(entry)
	if err := os.WriteFile(index, early, 0o600); err != nil {
		t.Fatal(err)
	}
	p := wantProblem(t, d.vmDo("POST", "/v1/sandboxes/c3/start?timeout=600000", nil), 409, "template-ineligible")
	if !strings.Contains(p.Detail, "early") {
		t.Fatalf("the refused start does not say early: %s", p.Detail)
	}
	wantProblem(t, d.vmDo("POST", "/v1/sandboxes", jsonBody(t, map[string]any{"id": "c4", "template": "mem", "runtime": "microvm", "start": true})), 409, "template-ineligible")
	procs, err := vm.Processes(d.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range procs {
		if base := filepath.Base(pr.Dir); base == "c3" || base == "c4" {
			t.Fatalf("a refused restore started a microVM process: %+v", pr)
		}
	}
	if _, err := os.Lstat(filepath.Join(d.Root, "sandboxes", "c3", "disk.qcow2")); err == nil {
		t.Fatal("a refused restore made the clone's disk")
	}
	if err := os.WriteFile(index, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := d.vmDo("DELETE", "/v1/sandboxes/c3", nil); r.Status != 204 {
		t.Fatalf("delete c3: %d %s", r.Status, r.Body)
	}

	// The lease: the generation (its frozen disk under every clone's overlay) stays while a
	// clone does.
	for _, id := range []string{"c1", "c2"} {
		wantProblem(t, d.vmDo("DELETE", "/v1/templates/mem/generations/"+g.ID, nil), 423, "generation-leased")
		if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil); r.Status != 200 {
			t.Fatalf("stop %s: %d %s", id, r.Status, r.Body)
		}
		if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	if r := d.vmDo("DELETE", "/v1/templates/mem/generations/"+g.ID, nil); r.Status != 204 {
		t.Fatalf("retiring the generation once its clones are gone: %d %s", r.Status, r.Body)
	}
	if _, err := os.Lstat(filepath.Dir(index)); err == nil {
		t.Fatal("the retired generation's directory is still there")
	}

	// A plain pause stops the VM; a resume lets the counter run on.
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/pause", nil); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"paused"`) {
		t.Fatalf("pause: %d %s", r.Status, r.Body)
	}
	if frozen, err := vm.Frozen(src, filepath.Join(d.Root, "sandboxes", src)); err != nil || !frozen {
		t.Fatalf("the paused microVM is not stopped: %v, %v", frozen, err)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/resume", nil); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"running"`) {
		t.Fatalf("resume: %d %s", r.Status, r.Body)
	}
	_, now := d.vmReadCount(src)
	d.vmWaitCount(src, now+2)

	// A pause with the memory released: QEMU ends, its memory saved in the state directory,
	// and the shim alone stays; a restart of bothyd finds it paused; a resume restores it
	// and the counter runs on.
	dir := filepath.Join(d.Root, "sandboxes", src)
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/pause", jsonBody(t, map[string]any{"memory": "release"})); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"paused"`) {
		t.Fatalf("pause with the memory released: %d %s", r.Status, r.Body)
	}
	d.wantOnlyShim(vm, dir)
	if _, err := os.Stat(filepath.Join(dir, "memory", "memory.state")); err != nil {
		t.Fatalf("the released memory: %v", err)
	}
	d.Restart(true)
	if r := d.vmDo("GET", "/v1/sandboxes/"+src, nil); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"paused"`) {
		t.Fatalf("a released microVM after a restart of bothyd: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.vmDo("POST", "/v1/sandboxes/"+src+"/exec", jsonBody(t, map[string]any{"command": []string{"true"}})), 409, "sandbox-paused")
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/resume?timeout=600000", nil); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"running"`) {
		t.Fatalf("resume of a released microVM: %d %s", r.Status, r.Body)
	}
	if p, n := d.vmReadCount(src); p != pid || n < now {
		t.Fatalf("the counter after the release and resume: pid %d at %d; was pid %d at %d", p, n, pid, now)
	}
	_, now = d.vmReadCount(src)
	d.vmWaitCount(src, now+2)
	d.vmWantClock(src)
	if _, err := os.Stat(filepath.Join(dir, "memory")); err == nil {
		t.Fatal("the released memory is still there after the resume")
	}

	// SIGKILL of bothyd while the capture holds the VM stopped.
	if r := d.vmDo("POST", "/v1/templates", jsonBody(t, map[string]any{"name": "killed"})); r.Status != 201 {
		t.Fatalf("create template: %d %s", r.Status, r.Body)
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), vmDeadline)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", d.URL+"/v1/templates/killed/generations", bytes.NewReader([]byte(`{"sandbox":"src"}`)))
		req.Header.Set("Content-Type", "application/json")
		if d.Token != "" {
			req.Header.Set("Authorization", "Bearer "+d.Token)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, vmDeadline, "the capture to stop the VM", func() bool {
		frozen, err := vm.Frozen(src, dir)
		return err == nil && frozen
	})
	d.Restart(true)
	waitFor(t, vmDeadline, "the restarted bothyd to let the VM run on", func() bool {
		frozen, err := vm.Frozen(src, dir)
		return err == nil && !frozen
	})
	_, now = d.vmReadCount(src)
	if p, _ := d.vmWaitCount(src, now+2); p != pid {
		t.Fatalf("the counter after the killed capture is pid %d, was %d", p, pid)
	}
	d.vmWantClock(src) // it stood stopped over the restart; its cont advanced it
	gens := decode[struct {
		Generations []generationJSON `json:"generations"`
	}](t, d.vmDo("GET", "/v1/templates/killed/generations", nil), 200)
	if len(gens.Generations) != 0 {
		t.Fatalf("a capture killed half-way left generations: %+v", gens.Generations)
	}
	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK || rep.Running != 1 {
		t.Fatalf("bothyd check after the killed capture exited %d: %+v\n%s", code, rep, stderr)
	}

	// A stop of a released microVM discards its memory.
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/pause", jsonBody(t, map[string]any{"memory": "release"})); r.Status != 200 {
		t.Fatalf("pause with the memory released: %d %s", r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/stop?timeout=300000", nil); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"stopped"`) {
		t.Fatalf("stop of a released microVM: %d %s", r.Status, r.Body)
	}
	if _, err := os.Stat(filepath.Join(dir, "memory")); err == nil {
		t.Fatal("the stop left the released memory")
	}

	// The shim of a released microVM SIGKILLed: bothyd check reports its memory as left
	// over, and --repair removes it.
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start again: %d %s", r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/pause", jsonBody(t, map[string]any{"memory": "release"})); r.Status != 200 {
		t.Fatalf("pause with the memory released: %d %s", r.Status, r.Body)
	}
	d.Stop()
	procs, err = vm.Processes(d.Root)
	if err != nil || len(procs) != 1 {
		t.Fatalf("the processes of the released microVM: %+v, %v", procs, err)
	}
	if err := platform.SignalVerified(procs[0].ID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, vmDeadline, "the killed shim to go", func() bool { return !procs[0].ID.Alive() })
	rep, code, stderr := runCheck(t, d.Root)
	if code == 0 || rep.OK || !slices.ContainsFunc(rep.Problems, func(p checkProblem) bool { return p.Kind == "leaked-runtime-file" }) {
		t.Fatalf("bothyd check beside the memory of a killed released microVM exited %d: %+v\n%s", code, rep, stderr)
	}
	if rep, code, stderr := runCheck(t, d.Root, "--repair"); code != 0 || !rep.OK {
		t.Fatalf("bothyd check --repair exited %d: %+v\n%s", code, rep, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "memory")); err == nil {
		t.Fatal("the repair left the released memory")
	}
	d.start()
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+src, nil); r.Status != 204 {
		t.Fatalf("delete: %d %s", r.Status, r.Body)
	}
	if left, err := vm.Processes(d.Root); err != nil || len(left) != 0 {
		t.Fatalf("microVM processes after the deletes: %+v, %v", left, err)
	}
	if rep, code, stderr := runCheck(t, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check at the end exited %d: %+v\n%s", code, rep, stderr)
	}
}

// wantOnlyShim fails unless the microVM in dir has its shim and no QEMU.
func (d *daemon) wantOnlyShim(vm *microvm.Runtime, dir string) {
	d.t.Helper()
	procs, err := vm.Processes(d.Root)
	if err != nil {
		d.t.Fatal(err)
	}
	var mine []runtime.Process
	for _, p := range procs {
		if p.Dir == dir {
			mine = append(mine, p)
		}
	}
	if len(mine) != 1 || mine[0].Role != runtime.RoleShim {
		d.t.Fatalf("the processes of a microVM whose memory is released: %+v, want its shim alone", mine)
	}
}

// vmWantClock fails unless the clock of the microVM id reads the host's, within two seconds
// (an exec's round trip under TCG included): a VM stopped, saved or restored has its clock
// advanced by the time it stood.
func (d *daemon) vmWantClock(id string) {
	d.t.Helper()
	before := time.Now()
	out := d.vmExec(id, "date", "+%s.%N")
	after := time.Now()
	secs, err := strconv.ParseFloat(out, 64)
	if err != nil {
		d.t.Fatalf("date in %s: %q", id, out)
	}
	guest := time.Unix(0, int64(secs*1e9))
	want := before.Add(after.Sub(before) / 2)
	if off := guest.Sub(want); off < -2*time.Second || off > 2*time.Second {
		d.t.Fatalf("the clock of %s reads %v, %v off the host's", id, guest, off)
	}
}

// createVM creates a sandbox from body and, unless it is to start, leaves it provisioned.
func (d *daemon) createVM(body map[string]any) {
	d.t.Helper()
	id := body["id"].(string)
	if r := d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(d.t, body)); r.Status != 201 {
		d.t.Fatalf("create %s: %d %s", id, r.Status, r.Body)
	}
	d.t.Cleanup(func() {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
	})
}

// vmReadCount reads the counter's pid and count in sandbox id.
func (d *daemon) vmReadCount(id string) (pid, count int) {
	d.t.Helper()
	f := strings.Fields(d.vmExec(id, "cat", "/dev/shm/pid", "/dev/shm/count"))
	if len(f) != 2 {
		d.t.Fatalf("the counter's files in %s read %q", id, f)
	}
	pid, err1 := strconv.Atoi(f[0])
	count, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		d.t.Fatalf("the counter's files in %s read %q", id, f)
	}
	return pid, count
}

// vmWaitCount waits until the counter in sandbox id reaches at least n, and returns its pid
// and count.
func (d *daemon) vmWaitCount(id string, n int) (pid, count int) {
	d.t.Helper()
	waitFor(d.t, vmDeadline, "the counter in "+id+" to reach "+strconv.Itoa(n), func() bool {
		out := d.vmExec(id, "sh", "-c", "cat /dev/shm/pid /dev/shm/count 2>/dev/null || true")
		f := strings.Fields(out)
		if len(f) != 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[0])
		count, _ = strconv.Atoi(f[1])
		return count >= n
	})
	return pid, count
}
