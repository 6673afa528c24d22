package tests

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMicroVMCheckpoints takes checkpoints of a microVM's disk and rolls back to them in
// place: a checkpoint of the running VM (frozen while its disk overlay is copied), an rm -rf
// of the user's home, a rollback that restores it while the sandbox keeps its id and runs
// again (restored from the checkpoint's memory: TestMicroVMMemoryCheckpoint); then a
// checkpoint of the stopped VM (its overlay moved into a layer, no copy), a rollback of the
// stopped VM to the first point, and a start on it. The checkpoints are listed with their
// sizes; a fork of the running VM standing on its chain runs on from its files (the fork's
// disk flattened onto the base disk: its fork-state names nothing of the source's chain) and
// goes on after the source's chain is deleted; bothyd check is clean beside the stopped VM standing on its chain (runtime/microvm's
// TestStaleSharedReadsCheckpointChains checks that a base disk only a chain names is no stale
// asset).
func TestMicroVMCheckpoints(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	d := startDaemon(t, withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	const id = "vm-cp"
	if r := d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
		"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256},
	})); r.Status != 201 {
		t.Fatalf("create the microVM: %d %s", r.Status, r.Body)
	}
	t.Cleanup(func() {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
	})
	d.vmExec(id, "sh", "-c", "mkdir -p /home/user/project && echo precious > /home/user/project/data && sync")

	t0 := time.Now()
	c1 := decode[checkpointJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints?timeout=600000", jsonBody(t, map[string]any{"name": "good"})), 201)
	t.Logf("checkpoint of the running microVM (TCG): %v, frozen %d ms, %d bytes", time.Since(t0), c1.FreezeMS, c1.SizeBytes)
	if c1.Name != "good" || c1.Mode != "copy" || c1.SizeBytes == 0 || c1.Layers != 1 {
		t.Fatalf("checkpoint of the running microVM: %+v", c1)
	}
	if got := d.vmExec(id, "cat", "/home/user/project/data"); got != "precious" {
		t.Fatalf("the microVM after its checkpoint: %q", got)
	}
	d.vmExec(id, "sh", "-c", "rm -rf /home/user/project && echo junk > /home/user/junk && sync")
	t0 = time.Now()
	st := decode[sandboxJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints/good/rollback?timeout=600000", nil), 200)
	t.Logf("rollback of the running microVM (TCG, a stop and a restore of its memory): %v", time.Since(t0))
	if st.ID != id || st.State != "running" {
		t.Fatalf("after the rollback: %+v", st)
	}
	if got := d.vmExec(id, "sh", "-c", "cat /home/user/project/data; ls /home/user/junk 2>/dev/null || echo gone"); got != "precious\ngone" {
		t.Fatalf("the files after the rollback: %q", got)
	}

	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	t0 = time.Now()
	c2 := decode[checkpointJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints", jsonBody(t, map[string]any{"name": "stopped"})), 201)
	t.Logf("checkpoint of the stopped microVM: %v, %d bytes", time.Since(t0), c2.SizeBytes)
	if c2.Mode != "rotate" || c2.Layers != 2 {
		t.Fatalf("checkpoint of the stopped microVM: %+v", c2)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start on the rotated disk: %d %s", r.Status, r.Body)
	}
	if got := d.vmExec(id, "sh", "-c", "cat /home/user/project/data; echo later > /home/user/later; sync"); got != "precious" {
		t.Fatalf("the files on the rotated disk: %q", got)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	if st := decode[sandboxJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints/good/rollback", nil), 200); st.State != "stopped" {
		t.Fatalf("the rollback of the stopped microVM: %+v", st)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start after the rollback: %d %s", r.Status, r.Body)
	}
	if got := d.vmExec(id, "sh", "-c", "cat /home/user/project/data; ls /home/user/later 2>/dev/null || echo gone"); got != "precious\ngone" {
		t.Fatalf("the files after the rollback of the stopped microVM: %q", got)
	}

	list := decode[struct{ Items []checkpointJSON }](t, d.vmDo("GET", "/v1/sandboxes/"+id+"/checkpoints", nil), 200)
	if len(list.Items) != 2 || list.Items[0].Name != "good" || list.Items[1].Name != "stopped" || list.Items[0].SizeBytes != c1.SizeBytes {
		t.Fatalf("the checkpoints: %+v", list.Items)
	}
	const fork = "vm-cp-fork"
	t0 = time.Now()
	fr := decode[forkJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/fork?timeout=600000", jsonBody(t, map[string]any{"ids": []string{fork}})), 200)
	t.Logf("fork of the running microVM on its checkpoint chain: %v, frozen %d ms", time.Since(t0), fr.FreezeMS)
	if len(fr.Items) != 1 || fr.Items[0].Sandbox == nil || fr.Items[0].Sandbox.State != "running" {
		t.Fatalf("the fork of the microVM on its chain: %+v", fr)
	}
	t.Cleanup(func() {
		d.vmDo("POST", "/v1/sandboxes/"+fork+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+fork, nil)
	})
	if b := vmDiskBacking(t, filepath.Join(d.Root, "sandboxes", fork, "fork-state", "disk.qcow2")); strings.Contains(b, "/sandboxes/") {
		t.Fatalf("the fork's saved disk backs onto %s, a sandbox's file; want the base disk", b)
	}
	if got := d.vmExec(fork, "sh", "-c", "cat /home/user/project/data; ls /home/user/later 2>/dev/null || echo gone"); got != "precious\ngone" {
		t.Fatalf("the files of the fork of the microVM on its chain: %q", got)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	checkCleanOf(t, d.Root, id)
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+id+"/checkpoints/stopped", nil); r.Status != 204 {
		t.Fatalf("delete a checkpoint: %d %s", r.Status, r.Body)
	}
	// The source and its chain gone, the fork runs on its own files and boots on them.
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
		t.Fatalf("delete the source: %d %s", r.Status, r.Body)
	}
	checkCleanOf(t, d.Root, fork)
	if r := d.vmDo("POST", "/v1/sandboxes/"+fork+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop the fork: %d %s", r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+fork+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start the fork after its source's delete: %d %s", r.Status, r.Body)
	}
	if got := d.vmExec(fork, "cat", "/home/user/project/data"); got != "precious" {
		t.Fatalf("the fork booted again after its source's delete reads %q", got)
	}
	checkCleanOf(t, d.Root, fork)
}

// vmDiskBacking is the backing file the header of the qcow2 disk at path names.
func vmDiskBacking(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", path).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", path, err)
	}
	var info struct {
		Backing string `json:"backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.Backing == "" {
		t.Fatalf("%s backs onto nothing: %s", path, out)
	}
	return info.Backing
}

// BenchmarkMicroVMCheckpoint is the cost of a microVM's disk checkpoints against the data the
// VM wrote to its disk (docs/checkpoints.md): for each size, a fresh microVM (TCG here) writes
// that much to its home (synced), then a checkpoint of the running VM (its overlay copied
// while it is frozen: freeze-ms is how long), a rollback to it (a stop and a boot), a stop
// and a checkpoint of the stopped VM (a rotation). Each is one operation, reported in ms.
func BenchmarkMicroVMCheckpoint(b *testing.B) {
	requireRoot(b)
	vm := requireMicroVM(b)
	d := startDaemon(b, withArgs("--log-level", "info", "--microvm-accel", vmAccel()))
	b.Cleanup(func() { reapMicroVMs(b, vm, d.Root) })
	made := 0 // the sub-benchmarks run more than once: every sandbox gets an id of its own
	for _, mb := range []int{10, 512} {
		b.Run(fmt.Sprintf("written-%dMiB", mb), func(b *testing.B) {
			var running, frozen, rollback, stopped time.Duration
			for range b.N {
				made++
				id := fmt.Sprintf("vmcpb-%d", made)
				if r := d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(b, map[string]any{
					"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256},
				})); r.Status != 201 {
					b.Fatalf("create: %d %s", r.Status, r.Body)
				}
				d.vmExec(id, "sh", "-c", fmt.Sprintf("dd if=/dev/urandom of=/home/user/data bs=1M count=%d 2>/dev/null && sync", mb))
				t0 := time.Now()
				c := decode[checkpointJSON](b, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints?timeout=600000", jsonBody(b, map[string]any{"name": "running"})), 201)
				running += time.Since(t0)
				frozen += time.Duration(c.FreezeMS) * time.Millisecond
				t0 = time.Now()
				if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints/running/rollback?timeout=600000", nil); r.Status != 200 {
					b.Fatalf("rollback: %d %s", r.Status, r.Body)
				}
				rollback += time.Since(t0)
				if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
					b.Fatalf("stop: %d %s", r.Status, r.Body)
				}
				t0 = time.Now()
				decode[checkpointJSON](b, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints", jsonBody(b, map[string]any{"name": "stopped"})), 201)
				stopped += time.Since(t0)
				if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
					b.Fatalf("delete: %d %s", r.Status, r.Body)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(running.Milliseconds())/n, "checkpoint-running-ms")
			b.ReportMetric(float64(frozen.Milliseconds())/n, "freeze-ms")
			b.ReportMetric(float64(rollback.Milliseconds())/n, "rollback-running-ms")
			b.ReportMetric(float64(stopped.Milliseconds())/n, "checkpoint-stopped-ms")
		})
	}
}
