package tests

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMicroVMForkCheckpoints takes checkpoints of a fork of a running microVM
// (docs/checkpoints.md, "Checkpoints of a fork: flattened"): one while it runs, with its
// memory, and one stopped (its disk rotated). Each layer's disk backs onto the image's base disk, not
// onto the fork's fork-state (it is flattened). The rollback of the running fork restores its
// memory (the source's counter runs on under the source's pid) and its files (one written in
// the source, one in the fork; what was written after the checkpoint gone); the stopped
// fork's chain boots with its files. With the source deleted, bothyd check finds nothing to
// do.
func TestMicroVMForkCheckpoints(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	newestCloudKernel(t)
	d := startDaemon(t, withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	const src, fork = "fcsrc", "fcfork"
	for _, id := range []string{src, fork} {
		t.Cleanup(func() {
			d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
			d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
		})
	}
	d.createVM(map[string]any{"id": src, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256}})
	d.vmExec(src, "sh", "-c", "echo one > /home/user/one && sync")
	d.vmExec(src, "sh", "-c", vmCounter)
	pid, _ := d.vmWaitCount(src, 2)
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/fork?timeout=600000", jsonBody(t, map[string]any{"ids": []string{fork}})); r.Status != 200 {
		t.Fatalf("fork %s: %d %s", src, r.Status, r.Body)
	}
	d.vmExec(fork, "sh", "-c", "echo two > /home/user/two && sync")

	// Every layer's disk stands on the base disk, none on the fork-state.
	layersAlone := func(n int) {
		t.Helper()
		disks, err := filepath.Glob(filepath.Join(d.Root, "sandboxes", fork, "checkpoints", "layers", "*", "disk.qcow2"))
		if err != nil || len(disks) != n {
			t.Fatalf("the fork's layers' disks: %v, %v; want %d", disks, err, n)
		}
		for _, disk := range disks {
			if b := vmDiskBacking(t, disk); strings.Contains(b, "/sandboxes/") {
				t.Fatalf("the layer disk %s backs onto %s, a sandbox's file; want the image's base disk", disk, b)
			}
		}
	}
	t0 := time.Now()
	c1 := decode[checkpointJSON](t, d.vmDo("POST", "/v1/sandboxes/"+fork+"/checkpoints?timeout=600000", jsonBody(t, map[string]any{"name": "running"})), 201)
	t.Logf("checkpoint of the running fork (TCG, 256 MiB): %v, frozen %d ms, %d bytes", time.Since(t0), c1.FreezeMS, c1.SizeBytes)
	if c1.Mode != "copy" || c1.SizeBytes == 0 {
		t.Fatalf("the checkpoint of the running fork: %+v", c1)
	}
	layersAlone(1)
	d.vmExec(fork, "sh", "-c", "rm /home/user/two && echo junk > /home/user/junk && sync")
	t0 = time.Now()
	if st := decode[sandboxJSON](t, d.vmDo("POST", "/v1/sandboxes/"+fork+"/checkpoints/running/rollback?timeout=600000", nil), 200); st.State != "running" {
		t.Fatalf("the rollback of the running fork: %+v", st)
	}
	t.Logf("rollback of the running fork (a restore of its checkpoint's memory): %v", time.Since(t0))
	if cpid, _ := d.vmReadCount(fork); cpid != pid {
		t.Fatalf("the fork rolled back runs a counter of pid %d; the source's is pid %d", cpid, pid)
	}
	if got := d.vmExec(fork, "sh", "-c", "cat /home/user/one /home/user/two; ls /home/user/junk 2>/dev/null || echo gone"); got != "one\ntwo\ngone" {
		t.Fatalf("the fork rolled back reads %q", got)
	}

	// Stopped, its disk is rotated into a layer, flattened first.
	d.vmExec(fork, "sh", "-c", "echo three > /home/user/three && sync")
	if r := d.vmDo("POST", "/v1/sandboxes/"+fork+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop %s: %d %s", fork, r.Status, r.Body)
	}
	c2 := decode[checkpointJSON](t, d.vmDo("POST", "/v1/sandboxes/"+fork+"/checkpoints", jsonBody(t, map[string]any{"name": "stopped"})), 201)
	if c2.Mode != "rotate" {
		t.Fatalf("the checkpoint of the stopped fork: %+v", c2)
	}
	layersAlone(2)
	// The fork holds what it stands on: its source deleted, it boots its chain.
	d.vmDo("POST", "/v1/sandboxes/"+src+"/stop?force=true", nil)
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+src, nil); r.Status != 204 {
		t.Fatalf("delete %s: %d %s", src, r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+fork+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start %s on its chain: %d %s", fork, r.Status, r.Body)
	}
	if got := d.vmExec(fork, "cat", "/home/user/one", "/home/user/two", "/home/user/three"); got != "one\ntwo\nthree" {
		t.Fatalf("the fork booted on its chain reads %q", got)
	}
	// Not --repair: this server shares the host's network namespace with other tests'.
	checkCleanOf(t, d.Root, src, fork)
}
