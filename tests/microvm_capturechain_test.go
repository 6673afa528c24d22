package tests

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMicroVMCaptureOfChainAndFork captures a running microVM that stands on a checkpoint
// chain and a fork of it (docs/checkpoints.md, "Captures of a chain or of a fork:
// flattened"): each generation's disk backs onto the image's base disk, not onto a file of its
// sandbox (the snapshot is flattened). With both sources deleted, bothyd check finds nothing
// to do, and a clone of each restores the counter of the source's memory and reads the files
// its source had: the chain's and the overlay's, and the fork's own.
func TestMicroVMCaptureOfChainAndFork(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	newestCloudKernel(t)
	d := startDaemon(t, withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	const src, fork = "capsrc", "capfork"
	for _, id := range []string{src, fork, "capc1", "capc2"} {
		t.Cleanup(func() {
			d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
			d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
		})
	}
	d.createVM(map[string]any{"id": src, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256}})
	d.vmExec(src, "sh", "-c", "echo one > /home/user/one && sync")
	d.vmExec(src, "sh", "-c", vmCounter)
	pid, _ := d.vmWaitCount(src, 2)
	// On a chain: the checkpoint holds the first file, and the rollback to it (which restores
	// its memory) makes the overlay back onto it; the overlay then holds the second.
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/checkpoints?timeout=600000", jsonBody(t, map[string]any{"name": "a"})); r.Status != 201 {
		t.Fatalf("checkpoint %s: %d %s", src, r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/checkpoints/a/rollback?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("rollback %s: %d %s", src, r.Status, r.Body)
	}
	if b := vmDiskBacking(t, filepath.Join(d.Root, "sandboxes", src, "disk.qcow2")); !strings.Contains(b, "/checkpoints/") {
		t.Fatalf("the disk of %s after its rollback backs onto %s; want its checkpoint's layer", src, b)
	}
	d.vmExec(src, "sh", "-c", "echo two > /home/user/two && sync")

	capture := func(template, from string) generationJSON {
		t.Helper()
		if r := d.vmDo("POST", "/v1/templates", jsonBody(t, map[string]any{"name": template})); r.Status != 201 {
			t.Fatalf("create template %s: %d %s", template, r.Status, r.Body)
		}
		t0 := time.Now()
		g := decode[generationJSON](t, d.vmDo("POST", "/v1/templates/"+template+"/generations?timeout=600000", jsonBody(t, map[string]any{"sandbox": from})), 201)
		t.Logf("capture of %s (TCG, 256 MiB): %v, %d bytes", from, time.Since(t0), g.SizeBytes)
		if g.State != "active" || g.Eligibility != "eligible" {
			t.Fatalf("the generation of %s: %+v", from, g)
		}
		if b := vmDiskBacking(t, filepath.Join(d.Root, "templates", template, g.ID, "payload", "disk.qcow2")); strings.Contains(b, "/sandboxes/") {
			t.Fatalf("the disk of the generation of %s backs onto %s, a sandbox's file; want the image's base disk", from, b)
		}
		return g
	}
	capture("onchain", src)
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/fork?timeout=600000", jsonBody(t, map[string]any{"ids": []string{fork}})); r.Status != 200 {
		t.Fatalf("fork %s: %d %s", src, r.Status, r.Body)
	}
	d.vmExec(fork, "sh", "-c", "echo three > /home/user/three && sync")
	capture("offork", fork)

	// The generations hold what they name: their sources (and the chain) deleted, the checker
	// keeps it all. Not --repair: this server shares the host's network namespace with other
	// tests', whose network objects its check would take for leaks.
	for _, id := range []string{src, fork} {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	checkCleanOf(t, d.Root, src, fork)

	for _, c := range []struct{ id, template, files string }{
		{"capc1", "onchain", "one\ntwo"},
		{"capc2", "offork", "one\ntwo\nthree"},
	} {
		t0 := time.Now()
		sb := decode[cloneJSON](t, d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
			"id": c.id, "template": c.template, "runtime": "microvm", "start": true})), 201)
		t.Logf("clone %s of %s: create and restore to running: %v", c.id, c.template, time.Since(t0))
		if sb.State != "running" {
			t.Fatalf("the clone %s: %+v", c.id, sb)
		}
		if cpid, _ := d.vmReadCount(c.id); cpid != pid {
			t.Fatalf("clone %s runs a counter of pid %d; the source's is pid %d", c.id, cpid, pid)
		}
		files := strings.Join(strings.Split(c.files, "\n"), " /home/user/")
		if got := d.vmExec(c.id, "sh", "-c", "cat /home/user/"+files); got != c.files {
			t.Fatalf("clone %s of %s reads %q; want %q", c.id, c.template, got, c.files)
		}
	}
	checkCleanOf(t, d.Root, "capc1", "capc2")
}
