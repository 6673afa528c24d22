package tests

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMicroVMForkOfFork forks a running microVM with a counter in its memory and a file on
// its disk, writes another file in the fork, and forks the fork: the second fork runs the
// source's counter on, under the source's pid, and holds both files; its saved disk backs onto
// the image's base disk, not onto its source's fork-state (the snapshot is flattened). With
// the source and the first fork deleted, bothyd check finds nothing to do,
// and the second fork, stopped and started again, boots on its own disk with both files.
// Stopped, it is forked by its disk alone: the third fork boots a copy of it (flattened onto
// the base disk) with every file, and boots it again once its source is deleted.
func TestMicroVMForkOfFork(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	newestCloudKernel(t)
	d := startDaemon(t, withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	const src, f1, f2 = "ffsrc", "ff1", "ff2"
	d.createVM(map[string]any{"id": src, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256}})
	for _, id := range []string{f1, f2} {
		t.Cleanup(func() {
			d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
			d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
		})
	}
	d.vmExec(src, "sh", "-c", "echo one > /home/user/one && sync")
	d.vmExec(src, "sh", "-c", vmCounter)
	pid, _ := d.vmWaitCount(src, 2)

	fork := func(from, to string) {
		t.Helper()
		t0 := time.Now()
		res := decode[forkJSON](t, d.vmDo("POST", "/v1/sandboxes/"+from+"/fork?timeout=600000", jsonBody(t, map[string]any{"ids": []string{to}})), 200)
		t.Logf("fork of %s into %s (TCG, 256 MiB): %v, frozen %d ms", from, to, time.Since(t0), res.FreezeMS)
		if len(res.Items) != 1 || res.Items[0].Sandbox == nil || res.Items[0].Sandbox.State != "running" {
			t.Fatalf("the fork of %s: %+v", from, res)
		}
		if b := vmDiskBacking(t, filepath.Join(d.Root, "sandboxes", to, "fork-state", "disk.qcow2")); strings.Contains(b, "/sandboxes/") {
			t.Fatalf("the saved disk of %s backs onto %s, a sandbox's file; want the image's base disk", to, b)
		}
	}
	fork(src, f1)
	d.vmExec(f1, "sh", "-c", "echo two > /home/user/two && sync")
	_, before := d.vmReadCount(f1)
	fork(f1, f2)
	cpid, first := d.vmReadCount(f2)
	if cpid != pid || first < before {
		t.Fatalf("the fork of the fork runs a counter of pid %d at %d; the source's is pid %d, the first fork's at %d before", cpid, first, pid, before)
	}
	d.vmWaitCount(f2, first+3)
	if got := d.vmExec(f2, "cat", "/home/user/one", "/home/user/two"); got != "one\ntwo" {
		t.Fatalf("the fork of the fork reads %q; want the source's file and the first fork's", got)
	}
	_, n := d.vmReadCount(f1)
	d.vmWaitCount(f1, n+2) // the first fork runs on after its freeze

	// The second fork holds what it runs on: its source and theirs deleted, the checker keeps
	// it all, and it boots again on its disk.
	for _, id := range []string{src, f1} {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	// Not --repair: this server shares the host's network namespace with other tests', whose
	// network objects its check would take for leaks (TestMicroVMForkMemory repairs in a
	// namespace of its own).
	checkCleanOf(t, d.Root, f2)
	if r := d.vmDo("POST", "/v1/sandboxes/"+f2+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop %s: %d %s", f2, r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+f2+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start %s after its sources' deletes: %d %s", f2, r.Status, r.Body)
	}
	if got := d.vmExec(f2, "cat", "/home/user/one", "/home/user/two"); got != "one\ntwo" {
		t.Fatalf("the fork of the fork booted again reads %q", got)
	}
	checkCleanOf(t, d.Root, f2)

	// A fork of the stopped fork is of its disk alone: it boots a copy of it, flattened onto
	// the base disk, with what was written since the restore, and the source stays stopped.
	d.vmExec(f2, "sh", "-c", "echo three > /home/user/three && sync")
	if r := d.vmDo("POST", "/v1/sandboxes/"+f2+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop %s: %d %s", f2, r.Status, r.Body)
	}
	const f3 = "ff3"
	t.Cleanup(func() {
		d.vmDo("POST", "/v1/sandboxes/"+f3+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+f3, nil)
	})
	t0 := time.Now()
	res := decode[forkJSON](t, d.vmDo("POST", "/v1/sandboxes/"+f2+"/fork?timeout=600000", jsonBody(t, map[string]any{"ids": []string{f3}})), 200)
	t.Logf("fork of the stopped %s into %s (a copy of its disk and a boot): %v", f2, f3, time.Since(t0))
	if res.FreezeMS != 0 || len(res.Items) != 1 || res.Items[0].Sandbox == nil || res.Items[0].Sandbox.State != "running" {
		t.Fatalf("the fork of the stopped fork: %+v", res)
	}
	if b := vmDiskBacking(t, filepath.Join(d.Root, "sandboxes", f3, "disk.qcow2")); strings.Contains(b, "/sandboxes/") {
		t.Fatalf("the disk of the fork of a stopped VM backs onto %s, a sandbox's file; want the image's base disk", b)
	}
	if got := d.vmExec(f3, "sh", "-c", "cat /home/user/one /home/user/two /home/user/three; test -e /dev/shm/pid && echo restored || echo booted"); got != "one\ntwo\nthree\nbooted" {
		t.Fatalf("the fork of the stopped fork reads %q; want the three files, booted", got)
	}
	if st := decode[sandboxJSON](t, d.vmDo("GET", "/v1/sandboxes/"+f2, nil), 200); st.State != "stopped" {
		t.Fatalf("the stopped source after its fork: %+v", st)
	}
	// Each holds its own: the source deleted, the fork boots again on its disk.
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+f2, nil); r.Status != 204 {
		t.Fatalf("delete %s: %d %s", f2, r.Status, r.Body)
	}
	checkCleanOf(t, d.Root, f3)
	if r := d.vmDo("POST", "/v1/sandboxes/"+f3+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop %s: %d %s", f3, r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+f3+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start %s after its source's delete: %d %s", f3, r.Status, r.Body)
	}
	if got := d.vmExec(f3, "cat", "/home/user/three"); got != "three" {
		t.Fatalf("the fork of the stopped fork booted again reads %q", got)
	}
	checkCleanOf(t, d.Root, f3)
}
