package tests

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// benchCheckpoints measures checkpoints, rollback and fork of sandboxes whose writable layer
// holds size bytes (one file of random data, disk_mb 0: the layer lives in the state
// directory), each iteration beside a bare bwrap spawn in the same loop, so that every figure
// reads as a ratio under the same load (docs/performance.md):
//
//   - ckpt-run: a checkpoint of the running sandbox (frozen copy of its upper); its freeze;
//   - fork1, fork10: a fork of the running sandbox into 1 and 10, to all of them running
//     (the answer comes once every fork started); the freeze each reports;
//   - rollback: a rollback of the running sandbox to that checkpoint (kill, swap, start);
//   - ckpt-stop, fork1-stop, fork10-stop, rollback-stop: the same of a stopped sandbox with
//     the same data in its upper (a rotation: no copy; the rollback swaps, starts nothing).
//
// The sandboxes are made and filled, and the forks deleted, with the timer stopped.
func benchCheckpoints(b *testing.B, size int64) {
	d := benchDaemon(b)
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (scripts/setup installs bubblewrap); the ratios need it")
	}
	fill := func(id string) {
		d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id, "start": true, "resources": map[string]any{"disk_mb": 0}})
		got := decode[execJSON](b, d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{
			"command": []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /home/user/blob && sync", size)}, "timeout_ms": 600000}), 200)
		if got.ExitCode != 0 {
			b.Fatalf("writing the layer's data: %+v", got)
		}
	}
	remove := func(id string) {
		d.doJSON("DELETE", "/v1/sandboxes/"+id+"?force=true", nil)
	}
	type forkAnswer struct {
		FreezeMS int64 `json:"freeze_ms"`
		Items    []struct {
			ID      string          `json:"id"`
			Sandbox *sandboxJSON    `json:"sandbox"`
			Error   *map[string]any `json:"error"`
		} `json:"items"`
	}
	fork := func(id string, n int) (time.Duration, time.Duration, []string) {
		t0 := time.Now()
		r := decode[forkAnswer](b, d.doJSON("POST", "/v1/sandboxes/"+id+"/fork?timeout=600000", map[string]any{"count": n}), 200)
		took := time.Since(t0)
		var ids []string
		for _, it := range r.Items {
			if it.Error != nil || it.Sandbox == nil || it.Sandbox.State != "running" {
				b.Fatalf("fork %s of %s: %+v", it.ID, id, it)
			}
			ids = append(ids, it.ID)
		}
		return took, time.Duration(r.FreezeMS) * time.Millisecond, ids
	}
	var base, ckptRun, ckptRunFreeze, fork1, fork1Freeze, fork10, fork10Freeze, rollback, ckptStop, fork1Stop, fork10Stop, rollbackStop latencies
	i := 0
	for b.Loop() {
		b.StopTimer()
		run, stp := fmt.Sprintf("run%d", i), fmt.Sprintf("stp%d", i)
		i++
		fill(run)
		fill(stp)
		d.mustStatus(200, "POST", "/v1/sandboxes/"+stp+"/stop?force=true", nil)
		// The stopped sandbox's figures first, on a file system with nothing left to write
		// back: on ext4 (data=ordered) a journal commit waits for the data written before it,
		// and the running sandbox's copies below write gigabytes.
		unix.Sync()
		b.StartTimer()

		var forks []string
		t0 := time.Now()
		d.mustStatus(201, "POST", "/v1/sandboxes/"+stp+"/checkpoints", map[string]any{"name": "c"})
		ckptStop = append(ckptStop, time.Since(t0))
		// The rotation moved the data into the chain: the forks of the stopped sandbox
		// share it as the running one's do (and rotate its empty upper).
		took, _, ids := fork(stp, 1)
		fork1Stop, forks = append(fork1Stop, took), append(forks, ids...)
		took, _, ids = fork(stp, 10)
		fork10Stop, forks = append(fork10Stop, took), append(forks, ids...)
		t0 = time.Now()
		d.mustStatus(200, "POST", "/v1/sandboxes/"+stp+"/checkpoints/c/rollback", nil)
		rollbackStop = append(rollbackStop, time.Since(t0))

		t0 = time.Now()
		if out, err := exec.Command(bwrap, bwrapArgs...).CombinedOutput(); err != nil {
			b.Fatalf("bwrap: %v: %s", err, out)
		}
		base = append(base, time.Since(t0))

		t0 = time.Now()
		c := decode[checkpointJSON](b, d.doJSON("POST", "/v1/sandboxes/"+run+"/checkpoints?timeout=600000", map[string]any{"name": "c"}), 201)
		ckptRun = append(ckptRun, time.Since(t0))
		ckptRunFreeze = append(ckptRunFreeze, time.Duration(c.FreezeMS)*time.Millisecond)

		took, frozen, ids := fork(run, 1)
		fork1, fork1Freeze, forks = append(fork1, took), append(fork1Freeze, frozen), append(forks, ids...)
		took, frozen, ids = fork(run, 10)
		fork10, fork10Freeze, forks = append(fork10, took), append(fork10Freeze, frozen), append(forks, ids...)

		t0 = time.Now()
		d.mustStatus(200, "POST", "/v1/sandboxes/"+run+"/checkpoints/c/rollback?timeout=600000", nil)
		rollback = append(rollback, time.Since(t0))

		b.StopTimer()
		for _, id := range append(forks, run, stp) {
			remove(id)
		}
		unix.Sync()
		b.StartTimer()
	}
	base.report(b, "bwrap-")
	for _, m := range []struct {
		name string
		l    latencies
	}{
		{"ckpt-run", ckptRun}, {"ckpt-run-freeze", ckptRunFreeze},
		{"fork1", fork1}, {"fork1-freeze", fork1Freeze}, {"fork10", fork10}, {"fork10-freeze", fork10Freeze},
		{"rollback", rollback}, {"ckpt-stop", ckptStop}, {"fork1-stop", fork1Stop}, {"fork10-stop", fork10Stop},
		{"rollback-stop", rollbackStop},
	} {
		b.ReportMetric(m.l.median()*1000, m.name+"-ms")
		b.ReportMetric(m.l.median()/base.median(), m.name+"/bwrap")
	}
}

func BenchmarkCheckpoints10MiB(b *testing.B)  { benchCheckpoints(b, 10<<20) }
func BenchmarkCheckpoints100MiB(b *testing.B) { benchCheckpoints(b, 100<<20) }
func BenchmarkCheckpoints1GiB(b *testing.B)   { benchCheckpoints(b, 1<<30) }
