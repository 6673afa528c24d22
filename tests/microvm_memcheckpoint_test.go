package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMicroVMMemoryCheckpoint takes a checkpoint of a running microVM with a counter in its
// memory and rolls back to it: the rollback restores the memory as well as the disk, so the
// counter runs on under its pid (a boot would have none: /dev/shm is the VM's memory), a
// file written to /dev/shm after the checkpoint is gone, and so is a disk write after it.
// Rolled back again while stopped, its next start restores the same point. bothyd check is
// clean after each. The checkpoint's listed size is its layer's, memory included, and
// --checkpoint-max-bytes counts the memory: a bound that the disk alone would fit refuses a
// memory checkpoint, and the stopped VM's checkpoint (its disk alone) fits it.
func TestMicroVMMemoryCheckpoint(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	newestCloudKernel(t)
	d := startDaemon(t, withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	const id = "vm-memcp"
	d.createVM(map[string]any{"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256}})
	d.vmExec(id, "sh", "-c", "echo before > /home/user/f && sync")
	d.vmExec(id, "sh", "-c", vmCounter)
	pid, _ := d.vmWaitCount(id, 2)

	t0 := time.Now()
	c := decode[checkpointJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints?timeout=600000", jsonBody(t, map[string]any{"name": "mem"})), 201)
	t.Logf("memory checkpoint of the running microVM (TCG, 256 MiB): %v, frozen %d ms, its layer (disk and memory) %d bytes", time.Since(t0), c.FreezeMS, c.SizeBytes)
	if c.FreezeMS <= 0 || c.Mode != "copy" {
		t.Fatalf("the memory checkpoint: %+v; want a copy whose freeze counts the memory's save", c)
	}
	layer := checkpointLayerBytes(t, d.Root, id, "mem")
	t.Logf("the checkpoint's layer: %v", layer)
	if layer["memory.state"] == 0 || layer["vm.json"] == 0 || layer["disk.qcow2"] == 0 {
		t.Fatalf("the memory checkpoint's layer holds %v; want its disk, memory and vm.json", layer)
	}
	if sum := layer["memory.state"] + layer["vm.json"] + layer["disk.qcow2"]; c.SizeBytes != sum || len(layer) != 3 {
		t.Fatalf("the checkpoint's size_bytes is %d; its layer holds %d (%v)", c.SizeBytes, sum, layer)
	}
	if l := listCheckpoints(t, d, id); len(l) != 1 || l[0].SizeBytes != c.SizeBytes {
		t.Fatalf("the listed checkpoints: %+v; want mem of %d bytes", l, c.SizeBytes)
	}
	_, atCheckpoint := d.vmReadCount(id)
	d.vmExec(id, "sh", "-c", "echo after > /dev/shm/after && echo after > /home/user/f && sync")
	d.vmWaitCount(id, atCheckpoint+3)

	wantPoint := func(when string) {
		t.Helper()
		if got := d.vmExec(id, "sh", "-c", "cat /home/user/f; cat /dev/shm/after 2>/dev/null || echo no-after"); got != "before\nno-after" {
			t.Fatalf("%s: the disk and memory read %q; want the checkpoint's (before, no /dev/shm/after)", when, got)
		}
		cpid, n := d.vmReadCount(id)
		if cpid != pid {
			t.Fatalf("%s: the counter is pid %d; the checkpoint's was %d", when, cpid, pid)
		}
		d.vmWaitCount(id, n+3)
		checkCleanOf(t, d.Root, id)
	}

	t0 = time.Now()
	st := decode[sandboxJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints/mem/rollback?timeout=600000", nil), 200)
	t.Logf("rollback of the running microVM to its memory checkpoint (a stop and a restore): %v", time.Since(t0))
	if st.State != "running" {
		t.Fatalf("after the rollback: %+v", st)
	}
	wantPoint("after the rollback of the running VM")

	// Rolled back while stopped: the next start restores the point.
	d.vmExec(id, "sh", "-c", "echo after > /dev/shm/after && echo after > /home/user/f && sync")
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	if st := decode[sandboxJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints/mem/rollback", nil), 200); st.State != "stopped" {
		t.Fatalf("the rollback of the stopped VM: %+v", st)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start after the rollback: %d %s", r.Status, r.Body)
	}
	wantPoint("after the rollback of the stopped VM and its start")

	// The restore is done: a later start boots the disk the VM left.
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/start?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("start: %d %s", r.Status, r.Body)
	}
	if got := d.vmExec(id, "sh", "-c", "cat /home/user/f; test -e /dev/shm/pid && echo restored || echo booted"); !strings.HasSuffix(got, "booted") {
		t.Fatalf("a start after the restore: %q; want a boot", got)
	}

	// The bound counts the memory. The disk of the next checkpoint fits (its overlay, at most
	// the first's and 16 MiB more, which the stopped VM's checkpoint shows below), its memory
	// (as large as the first's, more than 16 MiB) does not.
	mem := layer["memory.state"]
	if mem <= 32<<20 {
		t.Fatalf("the saved memory is %d bytes; this test needs more than 32 MiB to tell it from the disk", mem)
	}
	slack := layer["disk.qcow2"] + 16<<20
	d.Args = append(d.Args, "--checkpoint-max-bytes", fmt.Sprint(c.SizeBytes+slack))
	d.Restart(false)
	wantProblem(t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints?timeout=600000", jsonBody(t, map[string]any{"name": "over"})), 409, "checkpoint-limit")
	if l := listCheckpoints(t, d, id); len(l) != 1 {
		t.Fatalf("after the refused checkpoint: %+v", l)
	}
	checkCleanOf(t, d.Root, id)
	if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	disk := decode[checkpointJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/checkpoints", jsonBody(t, map[string]any{"name": "disk"})), 201)
	if disk.SizeBytes > slack {
		t.Fatalf("the stopped VM's checkpoint is %d bytes, more than the %d the refused one's disk was given", disk.SizeBytes, slack)
	}
	checkCleanOf(t, d.Root, id)
}

// listCheckpoints lists the checkpoints of sandbox id.
func listCheckpoints(t *testing.T, d *daemon, id string) []checkpointJSON {
	t.Helper()
	return decode[struct {
		Items []checkpointJSON `json:"items"`
	}](t, d.vmDo("GET", "/v1/sandboxes/"+id+"/checkpoints", nil), 200).Items
}

// checkpointLayerBytes is the bytes each file of the top layer of checkpoint name takes on
// the file system (blocks, as the checkpoint's size counts them), read from the state root.
func checkpointLayerBytes(t *testing.T, root, id, name string) map[string]int64 {
	t.Helper()
	dir := filepath.Join(root, "sandboxes", id, "checkpoints")
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Checkpoints []struct {
			Name  string   `json:"name"`
			Chain []string `json:"chain"`
		} `json:"checkpoints"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, c := range m.Checkpoints {
		if c.Name != name {
			continue
		}
		layer := filepath.Join(dir, "layers", c.Chain[0])
		ents, err := os.ReadDir(layer)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, e := range ents {
			fi, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return out
	}
	t.Fatalf("the manifest has no checkpoint %s: %s", name, b)
	return nil
}
