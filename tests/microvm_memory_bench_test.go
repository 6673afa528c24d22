package tests

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm"
)

// BenchmarkMicroVMMemory measures memory templates of microVMs, for a 256 MiB and a 1 GiB
// guest: the capture pause of a running VM (stop, save, copy of the overlay, cont: the
// generation's capture_pause_ms), the restore of a clone to its first answer (create with
// start, then an exec of true), and the idle memory of one microVM (the PSS of its QEMU, of
// the source VM after its boot and capture). A bare bwrap spawn is timed in the same run as
// the baseline (restore/bwrap). docs/microvm.md has the command and the figures.
func BenchmarkMicroVMMemory(b *testing.B) {
	requireRoot(b)
	vm := requireMicroVM(b)
	d := startVMDaemon(b, vm, withArgs("--log-level", "info"))
	bwrap, _ := exec.LookPath("bwrap")
	parent := b
	for _, mem := range []int{256, 1024} {
		b.Run(fmt.Sprintf("mem=%dMiB", mem), func(b *testing.B) {
			d.t = b
			defer func() { d.t = parent }()
			src, tpl := fmt.Sprintf("src%d", mem), fmt.Sprintf("mem%d", mem)
			d.mustStatus(201, "POST", "/v1/sandboxes?timeout=600000", map[string]any{"id": src, "runtime": "microvm", "start": true,
				"resources": map[string]any{"memory_mb": mem}})
			defer d.dispose(src)
			d.vmExec(src, "sh", "-c", vmCounter)
			d.vmWaitCount(src, 2)
			d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": tpl})
			g := decode[struct {
				ID             string `json:"id"`
				CapturePauseMS int64  `json:"capture_pause_ms"`
				SizeBytes      int64  `json:"size_bytes"`
			}](b, d.vmDo("POST", "/v1/templates/"+tpl+"/generations?timeout=600000", jsonBody(b, map[string]any{"sandbox": src})), 201)
			pss := qemuPSS(b, vm, d.Root, src)
			var restore, base latencies
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("c%d-%d", mem, i)
				t0 := time.Now()
				d.mustStatus(201, "POST", "/v1/sandboxes?timeout=600000", map[string]any{"id": id, "template": tpl, "runtime": "microvm", "start": true})
				d.vmExec(id, "true")
				restore = append(restore, time.Since(t0))
				b.StopTimer()
				d.dispose(id)
				if bwrap != "" {
					t1 := time.Now()
					if out, err := exec.Command(bwrap, bwrapArgs...).CombinedOutput(); err != nil {
						b.Fatalf("bwrap: %v: %s", err, out)
					}
					base = append(base, time.Since(t1))
				}
				b.StartTimer()
			}
			restore.report(b, "restore-")
			b.ReportMetric(float64(g.CapturePauseMS), "capture-pause-ms")
			b.ReportMetric(float64(g.SizeBytes)/(1<<20), "generation-MiB")
			b.ReportMetric(pss/(1<<20), "idle-qemu-pss-MiB")
			if len(base) > 0 {
				b.ReportMetric(restore.median()/base.median(), "restore/bwrap")
			}
			d.mustStatus(204, "DELETE", "/v1/templates/"+tpl+"/generations/"+g.ID, nil)
		})
	}
}

// qemuPSS is the proportional set size, in bytes, of the QEMU of sandbox id.
func qemuPSS(b *testing.B, vm *microvm.Runtime, root, id string) float64 {
	b.Helper()
	procs, err := vm.Processes(root)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range procs {
		if p.Role != runtime.RoleInit || !strings.HasSuffix(p.Dir, "/"+id) {
			continue
		}
		f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", p.ID.Pid))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == "Pss" {
				kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				if err != nil {
					b.Fatal(err)
				}
				return kb * 1024
			}
		}
		b.Fatalf("no Pss in the smaps_rollup of QEMU %d", p.ID.Pid)
	}
	b.Fatalf("no QEMU of %s among %+v", id, procs)
	return 0
}
