package tests

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestMicroVMVolumes mounts one volume into a microVM (read-write at /data and read-only at
// /mnt/ro, through virtio-fs) and into a namespace sandbox at once: each reads the other's
// file at once, both see the writer as the sandbox user (1000), and the API reads the
// microVM's file without any sandbox. The microVM's read-only mount refuses a write; a write
// past the volume's size fails with ENOSPC inside the microVM, and the files API answers 507
// volume-full for it, in the microVM and in the namespace sandbox alike (neither blames the
// sandbox's disk or the state root). The volume is in use while they are; a microVM with
// volumes refuses a pause that would save its memory and a capture (which saves it), and runs
// on; bothyd check is clean beside it.
func TestMicroVMVolumes(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	if err := vm.VolumeSupport(); err != nil {
		t.Skipf("microVMs mount no volumes on this host: %v", err)
	}
	d := startDaemon(t, withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })
	d.createVolume("shared", 16)
	d.createWithVolumes("ns-a", map[string]any{"name": "shared", "path": "/data"})

	const id = "vm-vol"
	r := d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
		"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256},
		"volumes": []map[string]any{{"name": "shared", "path": "/data"}, {"name": "shared", "path": "/mnt/ro", "read_only": true}},
	}))
	if r.Status != 201 {
		t.Fatalf("create a microVM with volumes: %d %s", r.Status, r.Body)
	}
	t.Cleanup(func() {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
	})

	if got := d.vmExec(id, "sh", "-c", "echo from-vm > /data/v && stat -c %u:%g /data/v"); got != "1000:1000" {
		t.Fatalf("the microVM user's file: %q", got)
	}
	if got := d.sh("ns-a", "cat /data/v && stat -c %u:%g /data/v && echo from-ns > /data/n"); got.ExitCode != 0 || got.Stdout != "from-vm\n1000:1000\n" {
		t.Fatalf("the namespace sandbox reading the microVM's file: %+v", got)
	}
	if got := d.vmExec(id, "sh", "-c", "cat /data/n /mnt/ro/v && stat -c %u /data/n"); got != "from-ns\nfrom-vm\n1000" {
		t.Fatalf("the microVM reading the namespace sandbox's file: %q", got)
	}
	if r := d.do("GET", "/v1/volumes/shared/files?path=/v", nil, nil); r.Status != 200 || string(r.Body) != "from-vm\n" {
		t.Fatalf("the API reading the microVM's file: %d %q", r.Status, r.Body)
	}

	ro := decode[execJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/exec", jsonBody(t, map[string]any{
		"command": []string{"sh", "-c", "echo x > /mnt/ro/x"}})), 200)
	if ro.ExitCode == 0 || !strings.Contains(ro.Stderr, "Read-only file system") {
		t.Fatalf("a write through the microVM's read-only mount: %+v", ro)
	}
	full := decode[execJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/exec", jsonBody(t, map[string]any{
		"command": []string{"sh", "-c", "dd if=/dev/zero of=/data/big bs=1M count=32 2>&1; rc=$?; rm -f /data/big; echo rc=$rc"}})), 200)
	if !strings.Contains(full.Stdout, "No space left on device") || strings.Contains(full.Stdout, "rc=0") {
		t.Fatalf("a write past the volume's size inside the microVM: %+v", full)
	}
	for _, sb := range []string{id, "ns-a"} {
		p := wantProblem(t, d.vmDo("PUT", "/v1/sandboxes/"+sb+"/files?path=/data/big", bytes.NewReader(make([]byte, 32<<20))), 507, "volume-full")
		if !strings.Contains(p.Detail, "shared") {
			t.Errorf("the refusal in %s does not name the volume: %s", sb, p.Detail)
		}
	}

	p := wantProblem(t, d.do("DELETE", "/v1/volumes/shared", nil, nil), 423, "volume-in-use")
	if !strings.Contains(p.Detail, id) || !strings.Contains(p.Detail, "ns-a") {
		t.Errorf("the refusal does not name both sandboxes: %s", p.Detail)
	}
	wantProblem(t, d.vmDo("POST", "/v1/sandboxes/"+id+"/pause", jsonBody(t, map[string]any{"memory": "release"})), 501, "not-implemented")
	if r := d.vmDo("POST", "/v1/templates", jsonBody(t, map[string]any{"name": "vt"})); r.Status != 201 {
		t.Fatalf("create template: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.vmDo("POST", "/v1/templates/vt/generations?timeout=600000", jsonBody(t, map[string]any{"sandbox": id})), 501, "not-implemented")
	if got := d.vmExec(id, "cat", "/data/v"); got != "from-vm" {
		t.Fatalf("the microVM after the refused pause: %q", got)
	}
	if rep := checkCleanOf(t, d.Root, id, "ns-a"); rep.Running != 2 {
		t.Fatalf("bothyd check beside a microVM with volumes: %+v", rep)
	}
}

// checkCleanOf runs bothyd check on root and fails t for every problem but a leaked network
// object that names none of ids: the host's nftables table is every server's on this host,
// and a chain another test's server left there is not this one's.
func checkCleanOf(t *testing.T, root string, ids ...string) checkReport {
	t.Helper()
	rep, code, stderr := runCheck(t, root)
	for _, p := range rep.Problems {
		ours := false
		for _, id := range ids {
			ours = ours || strings.Contains(p.Detail, id)
		}
		if p.Kind == "leaked-network" && !ours {
			t.Logf("bothyd check found another server's leftover: %+v", p)
			continue
		}
		t.Errorf("bothyd check: %+v", p)
	}
	if code != 0 && len(rep.Problems) == 0 {
		t.Fatalf("bothyd check exited %d: %+v\n%s", code, rep, stderr)
	}
	return rep
}

// microVMVolumeBenchBytes is what each iteration of BenchmarkMicroVMVolumeThroughput writes or
// reads: less than BenchmarkVolumeThroughput's, a TCG guest copying at tens of MB/s.
const microVMVolumeBenchBytes = 64 << 20

// BenchmarkMicroVMVolumeThroughput is a volume's write and read throughput from inside a
// microVM (virtio-fs, cache=none) against the same volume from inside a namespace sandbox and
// against the microVM's own disk (its qcow2 overlay on virtio-blk), in one run on one server
// (docs/volumes.md): dd of microVMVolumeBenchBytes, fdatasync'd, then read back (from the
// guest's page cache for its own disk; through virtiofsd every time for the volume, which the
// guest does not cache). MB/s is the throughput. Under TCG the guest's own copying dominates:
// the figures compare paths on one host, not a KVM host's speeds.
func BenchmarkMicroVMVolumeThroughput(b *testing.B) {
	requireRoot(b)
	vm := requireMicroVM(b)
	if err := vm.VolumeSupport(); err != nil {
		b.Skipf("microVMs mount no volumes on this host: %v", err)
	}
	d := startDaemon(b, withArgs("--log-level", "info", "--microvm-accel", vmAccel()))
	b.Cleanup(func() { reapMicroVMs(b, vm, d.Root) })
	d.mustStatus(201, "POST", "/v1/volumes", map[string]any{"name": "bench", "size_mb": 1024})
	b.Cleanup(func() { d.doJSON("DELETE", "/v1/volumes/bench", nil) })
	vols := []map[string]any{{"name": "bench", "path": "/data"}}
	if r := d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(b, map[string]any{"id": "vm-bench", "runtime": "microvm",
		"start": true, "resources": map[string]any{"memory_mb": 512}, "volumes": vols})); r.Status != 201 {
		b.Fatalf("create the microVM: %d %s", r.Status, r.Body)
	}
	b.Cleanup(func() { d.dispose("vm-bench") })
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "ns-bench", "start": true, "volumes": vols})
	b.Cleanup(func() { d.dispose("ns-bench") })

	dd := func(b *testing.B, id, script string) {
		b.Helper()
		got := decode[execJSON](b, d.vmDo("POST", "/v1/sandboxes/"+id+"/exec", jsonBody(b, map[string]any{
			"command": []string{"sh", "-c", script}, "timeout_ms": 600000})), 200)
		if got.ExitCode != 0 {
			b.Fatalf("%s: %+v", script, got)
		}
	}
	write := fmt.Sprintf("dd if=/dev/zero of=%%s bs=1M count=%d conv=fdatasync 2>/dev/null", microVMVolumeBenchBytes>>20)
	read := "dd if=%s of=/dev/null bs=1M 2>/dev/null"
	for _, c := range []struct{ name, id, file string }{
		{"microvm-volume", "vm-bench", "/data/vm"},
		{"microvm-own-disk", "vm-bench", "/home/user/f"},
		{"namespace-volume", "ns-bench", "/data/ns"},
	} {
		b.Run("write/"+c.name, func(b *testing.B) {
			b.SetBytes(microVMVolumeBenchBytes)
			for range b.N {
				dd(b, c.id, fmt.Sprintf(write, c.file))
			}
		})
		b.Run("read/"+c.name, func(b *testing.B) {
			b.SetBytes(microVMVolumeBenchBytes)
			for range b.N {
				dd(b, c.id, fmt.Sprintf(read, c.file))
			}
		})
	}
}
