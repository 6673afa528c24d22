package tests

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm"
)

// BenchmarkMicroVMCycle is a microVM's whole life through HTTP (host image, 256 MiB, 1 vCPU,
// the accelerator of vmAccel: TCG here): create with start (a cold boot to the agent's first
// answer), exec `true`, forced stop, delete; with a bare bwrap spawn in the same loop for the
// ratio, and the QEMU's resident memory once the guest is up (idle memory per microVM). The
// first start on the state root, which makes the initramfs and the host base disk, is reported
// apart (first-start-ms) and not in the loop. docs/microvm.md has the command and the figures.
func BenchmarkMicroVMCycle(b *testing.B) {
	requireRoot(b)
	vm := requireMicroVM(b)
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (scripts/setup installs bubblewrap); the ratio needs it")
	}
	d := startDaemon(b, withArgs("--log-level", "info", "--microvm-accel", vmAccel()))
	b.Cleanup(func() { reapMicroVMs(b, vm, d.Root) })
	create := map[string]any{"runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256}}
	t0 := time.Now()
	create["id"] = "vmwarm"
	d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(b, create))
	first := time.Since(t0)
	d.vmExec("vmwarm", "true")
	d.dispose("vmwarm")

	names := []string{"create+start", "exec", "stop", "delete"}
	steps := make([]latencies, len(names))
	var base latencies
	var rss []int
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("vmbench%d", i)
		create["id"] = id
		t := time.Now()
		lap := func(step int) {
			now := time.Now()
			steps[step] = append(steps[step], now.Sub(t))
			t = now
		}
		if r := d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(b, create)); r.Status != 201 {
			b.Fatalf("create: %d %s", r.Status, r.Body)
		}
		lap(0)
		d.vmExec(id, "true")
		lap(1)
		b.StopTimer()
		rss = append(rss, qemuRSSKiB(b, vm, d.Root))
		b.StartTimer()
		t = time.Now()
		if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil); r.Status != 200 {
			b.Fatalf("stop: %d %s", r.Status, r.Body)
		}
		lap(2)
		if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			b.Fatalf("delete: %d %s", r.Status, r.Body)
		}
		lap(3)
		t0 := time.Now()
		if out, err := exec.Command(bwrap, bwrapArgs...).CombinedOutput(); err != nil {
			b.Fatalf("bwrap: %v: %s", err, out)
		}
		base = append(base, time.Since(t0))
	}
	b.ReportMetric(float64(first.Milliseconds()), "first-start-ms")
	for j, name := range names {
		b.ReportMetric(steps[j].median()*1000, name+"-ms")
	}
	b.ReportMetric(base.median()*1000, "bwrap-median-ms")
	b.ReportMetric(steps[0].median()/base.median(), "create+start/bwrap")
	if len(rss) > 0 {
		b.ReportMetric(float64(median(rss))/1024, "qemu-rss-MiB")
	}
}

// qemuRSSKiB is the resident memory of the one QEMU running under root.
func qemuRSSKiB(b *testing.B, vm *microvm.Runtime, root string) int {
	b.Helper()
	procs, err := vm.Processes(root)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range procs {
		if p.Role != runtime.RoleInit {
			continue
		}
		st, err := os.ReadFile("/proc/" + strconv.Itoa(p.ID.Pid) + "/status")
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.SplitSeq(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
				if err != nil {
					b.Fatalf("VmRSS %q: %v", v, err)
				}
				return kb
			}
		}
	}
	b.Fatalf("no QEMU under %s: %+v", root, procs)
	return 0
}

func median(v []int) int {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
