package tests

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// vmForkJSON is a fork's answer, with each fork's address.
type vmForkJSON struct {
	FreezeMS int64 `json:"freeze_ms"`
	Items    []struct {
		ID      string          `json:"id"`
		Sandbox *netSandboxJSON `json:"sandbox"`
		Error   *problem        `json:"error"`
	} `json:"items"`
}

// TestMicroVMForkMemory forks a running, networked microVM with a counter in its memory (a
// tmpfs file and a shell loop: nothing but the VM's memory holds them) into two, inside the
// network tests' own small internet: the fork reports the source's freeze, and in each fork
// the counter's process runs on, with the source's pid, from at least the count the source
// had before the fork (a restart would begin again at 1 under another pid), and each fork
// has an address and a MAC of its own (neither the source's nor the other's), the one its
// sandbox shows, which reaches the allowed host; a file the source wrote to its disk before
// the fork is in each fork. The source runs on, counting. The forks hold what they run on:
// with the source deleted, bothyd check and check --repair find nothing to do, and a fork
// stopped and started again boots on its disk, the source's file in it (a fork of a fork:
// TestMicroVMForkOfFork). A SIGKILL of bothyd mid-fork (forkCrash) leaves the source running and each
// fork gone or whole. Nothing is left at the end.
func TestMicroVMForkMemory(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	newestCloudKernel(t)
	w := newNetWorld(t)
	d := startVMDaemon(t, vm, w.daemon())
	policy := map[string]any{"allow": []string{"allowed.test"}}

	const src = "fksrc"
	d.createVM(map[string]any{"id": src, "runtime": "microvm", "start": true, "network": policy, "resources": map[string]any{"memory_mb": 256}})
	ids, srcAddr := d.newVMIdentities(src)
	d.vmExec(src, "sh", "-c", "echo before-fork > /home/user/mark && sync")
	d.vmExec(src, "sh", "-c", vmCounter)
	pid, before := d.vmWaitCount(src, 2)

	d.forkCrash(w, src, pid)

	forks := []string{"fk1", "fk2"}
	begin := time.Now()
	r := d.vmDo("POST", "/v1/sandboxes/"+src+"/fork?timeout=600000", jsonBody(t, map[string]any{"ids": forks}))
	took := time.Since(begin)
	for _, id := range forks {
		t.Cleanup(func() {
			d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
			d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
		})
	}
	res := decode[vmForkJSON](t, r, 200)
	t.Logf("fork of a running microVM (256 MiB) into %d: %v, the source frozen %d ms", len(forks), took, res.FreezeMS)
	if res.FreezeMS <= 0 {
		t.Fatalf("the fork reports a freeze of %d ms; the source was frozen while its memory was saved", res.FreezeMS)
	}
	if len(res.Items) != len(forks) {
		t.Fatalf("the fork answered %d items, want %d: %+v", len(res.Items), len(forks), res)
	}

	for i, it := range res.Items {
		id := forks[i]
		if it.ID != id || it.Error != nil || it.Sandbox == nil || it.Sandbox.State != "running" {
			t.Fatalf("fork %s: %+v %+v %+v", id, it.ID, it.Sandbox, it.Error)
		}
		addr, mac := d.own(ids, id, it.Sandbox.Address)
		cpid, first := d.vmReadCount(id)
		if cpid != pid || first < before {
			t.Fatalf("fork %s: counter pid %d at %d; the source's is pid %d, at %d before the fork", id, cpid, first, pid, before)
		}
		d.vmWaitCount(id, first+3)
		if got := d.vmExec(id, "cat", "/home/user/mark"); got != "before-fork" {
			t.Fatalf("fork %s reads %q from the source's file", id, got)
		}
		d.vmReaches(id)
		t.Logf("fork %s: address %s, MAC %s, counter pid %d on from %d (the source at %d before the fork)", id, addr, mac, cpid, first, before)
	}
	// The source runs on after its freeze, with its own address.
	if st := decode[netSandboxJSON](t, d.vmDo("GET", "/v1/sandboxes/"+src, nil), 200); st.State != "running" || st.Address != srcAddr.String() {
		t.Fatalf("the source after the fork: %+v; want it running with address %s", st, srcAddr)
	}
	spid, n := d.vmReadCount(src)
	if spid != pid {
		t.Fatalf("the source's counter is pid %d after the fork; was %d", spid, pid)
	}
	d.vmWaitCount(src, n+3)

	// The forks hold what they run on: the source deleted, the checker keeps it all, and a
	// fork boots again on its disk.
	d.vmDo("POST", "/v1/sandboxes/"+src+"/stop?force=true", nil)
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+src, nil); r.Status != 204 {
		t.Fatalf("delete of the source: %d %s", r.Status, r.Body)
	}
	if rep, code, stderr := runCheckIn(t, w.host, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check with the forks and no source exited %d: %+v\n%s", code, rep, stderr)
	}
	if rep, code, stderr := runCheckIn(t, w.host, d.Root, "--repair"); code != 0 || !rep.OK {
		t.Fatalf("bothyd check --repair with the forks and no source exited %d: %+v\n%s", code, rep, stderr)
	}
	const cold = "fk2"
	if _, err := os.Stat(filepath.Join(d.Root, "sandboxes", cold, "fork-state", "disk.qcow2")); err != nil {
		t.Fatalf("the fork's frozen disk after check --repair: %v", err)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+cold+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop of fork %s: %d %s", cold, r.Status, r.Body)
	}
	begin = time.Now()
	if r := d.vmDo("POST", "/v1/sandboxes/"+cold+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start of fork %s after its source's delete: %d %s", cold, r.Status, r.Body)
	}
	t.Logf("fork %s booted again (a cold boot on its disk): %v", cold, time.Since(begin))
	if got := d.vmExec(cold, "cat", "/home/user/mark"); got != "before-fork" {
		t.Fatalf("fork %s booted again reads %q from the source's file", cold, got)
	}
	_, n = d.vmReadCount("fk1")
	d.vmWaitCount("fk1", n+2) // the other fork runs on

	for _, id := range forks {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	if left, err := vm.Processes(d.Root); err != nil || len(left) != 0 {
		t.Fatalf("microVM processes after the deletes: %+v, %v", left, err)
	}
	w.noLeftovers(t, d)
	if rep, code, stderr := runCheckIn(t, w.host, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check at the end exited %d: %+v\n%s", code, rep, stderr)
	}
}

// forkCrash SIGKILLs bothyd in the middle of a fork of the running microVM src (its counter's
// pid is pid): once the first fork's saved state is in its directory, while that fork is
// restored. After the restart the source runs on, counting (thawed), each fork is either
// gone (its provision was pending) or a whole fork running the source's counter, and bothyd
// check is clean; the forks that survived are deleted.
func (d *daemon) forkCrash(w *netWorld, src string, pid int) {
	t := d.t
	t.Helper()
	ids := []string{"fkc1", "fkc2"}
	req, err := http.NewRequest("POST", d.URL+"/v1/sandboxes/"+src+"/fork?timeout=600000", jsonBody(t, map[string]any{"ids": ids}))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if d.Token != "" {
		req.Header.Set("Authorization", "Bearer "+d.Token)
	}
	// The daemon's own client (it reaches bothyd in its network namespace), without the
	// contract check: the answer is cut by the crash.
	client := d.httpClient()
	done := make(chan string, 1)
	go func() {
		resp, err := client.Do(req)
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	state := filepath.Join(d.Root, "sandboxes", ids[0], "fork-state", "vm.json")
	answered := ""
	waitFor(t, vmDeadline, "the first fork's saved state", func() bool {
		select {
		case answered = <-done:
			return true
		default:
		}
		_, err := os.Stat(state)
		return err == nil
	})
	if answered != "" {
		t.Fatalf("the fork answered before its first fork's state was made: %s", answered)
	}
	d.Kill()
	<-done
	d.start()
	if st := decode[netSandboxJSON](t, d.vmDo("GET", "/v1/sandboxes/"+src, nil), 200); st.State != "running" {
		t.Fatalf("the source after a crash mid-fork: %+v", st)
	}
	_, n := d.vmReadCount(src)
	d.vmWaitCount(src, n+3) // thawed
	for _, id := range ids {
		r := d.vmDo("GET", "/v1/sandboxes/"+id, nil)
		switch r.Status {
		case 404:
			t.Logf("after a crash mid-fork: %s is gone", id)
		case 200:
			if st := decode[netSandboxJSON](t, r, 200); st.State != "running" {
				t.Fatalf("after a crash mid-fork: %s is %+v; want it gone or running", id, st)
			}
			if cpid, _ := d.vmReadCount(id); cpid != pid {
				t.Fatalf("after a crash mid-fork: %s runs a counter of pid %d; the source's is %d", id, cpid, pid)
			}
			t.Logf("after a crash mid-fork: %s is a whole fork, running", id)
		default:
			t.Fatalf("after a crash mid-fork: GET %s: %d %s", id, r.Status, r.Body)
		}
	}
	if rep, code, stderr := runCheckIn(t, w.host, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check after a crash mid-fork exited %d: %+v\n%s", code, rep, stderr)
	}
	for _, id := range ids {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
	}
}
