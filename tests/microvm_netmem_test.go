package tests

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMicroVMNetworkMemory captures a networked microVM with a counter in its memory, inside
// the network tests' own small internet (see newNetWorld; nothing leaves the test's
// namespaces), and clones it: two clones with the source's policy each run the counter on
// and have an address and a MAC of their own (neither the source's nor the other's, nothing
// left of the source's), which reaches the allowed host as the policy says; a clone without a
// network has its NIC (the saved devices have one) but down, with no address, and reaches
// nothing. A networked clone's memory released by a pause survives a SIGKILL of bothyd
// (bothyd check clean beside it), and its resume keeps its address and its reach, the
// counter running on; so does a crash of bothyd in either window of a resume (before and
// after the thaw).
// A networked clone of a generation captured without a NIC is refused (503) before anything
// is made.
func TestMicroVMNetworkMemory(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	newestCloudKernel(t)
	w := newNetWorld(t)
	d := startVMDaemon(t, vm, w.daemon())
	policy := map[string]any{"allow": []string{"allowed.test"}}

	const src = "nsrc"
	d.createVM(map[string]any{"id": src, "runtime": "microvm", "start": true, "network": policy, "resources": map[string]any{"memory_mb": 256}})
	ids, srcAddr := d.newVMIdentities(src)
	d.vmExec(src, "sh", "-c", vmCounter)
	pid, before := d.vmWaitCount(src, 2)
	if r := d.vmDo("POST", "/v1/templates", jsonBody(t, map[string]any{"name": "netmem"})); r.Status != 201 {
		t.Fatalf("create template: %d %s", r.Status, r.Body)
	}
	g := decode[generationJSON](t, d.vmDo("POST", "/v1/templates/netmem/generations?timeout=600000", jsonBody(t, map[string]any{"sandbox": src})), 201)
	// The generation says its saved devices include the NIC.
	var saved struct {
		NIC bool `json:"nic"`
	}
	b, err := os.ReadFile(filepath.Join(d.Root, "templates", "netmem", g.ID, "payload", "vm.json"))
	if err == nil {
		err = json.Unmarshal(b, &saved)
	}
	if err != nil || !saved.NIC {
		t.Fatalf("the generation's vm.json: %s, %v; want it to record the NIC", b, err)
	}
	// The source runs on, reaching what it reached.
	d.vmReaches(src)

	for _, id := range []string{"n1", "n2"} {
		begin := time.Now()
		sb := decode[netSandboxJSON](t, d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
			"id": id, "template": "netmem", "runtime": "microvm", "start": true, "network": policy})), 201)
		t.Logf("networked clone %s: create and restore to running, its network attached: %v", id, time.Since(begin))
		if sb.State != "running" {
			t.Fatalf("the networked clone %s: %+v", id, sb)
		}
		d.own(ids, id, sb.Address)
		cpid, first := d.vmReadCount(id)
		if cpid != pid || first < before {
			t.Fatalf("clone %s: counter pid %d at %d; the source's is pid %d, at %d before the capture", id, cpid, first, pid, before)
		}
		d.vmWaitCount(id, first+3)
		d.vmReaches(id)
	}

	for line := range strings.Lines(d.logs.String()) {
		if strings.Contains(line, "network: attached") {
			t.Logf("the supervisor's network setup (Setup and the join): %s", strings.TrimSpace(line))
		}
	}

	// Without a network: the NIC is there (the saved devices), down, with no address.
	begin := time.Now()
	d.createVM(map[string]any{"id": "n3", "template": "netmem", "runtime": "microvm", "start": true})
	t.Logf("clone without a network: create and restore to running, its NIC down: %v", time.Since(begin))
	if got := d.vmExec("n3", "ip", "-4", "-o", "addr", "show", "dev", "eth0"); got != "" {
		t.Fatalf("the clone without a network has addresses on eth0: %q", got)
	}
	if got := d.vmExec("n3", "cat", "/sys/class/net/eth0/operstate"); got != "down" {
		t.Fatalf("the clone without a network has eth0 %s; want it down", got)
	}
	if got := d.vmExec("n3", "cat", "/proc/net/fib_trie"); strings.Contains(got, srcAddr.String()) {
		t.Fatalf("the clone without a network keeps its source's address %s:\n%s", srcAddr, got)
	}
	if r := d.vmRun("n3", "curl", "-sS", "-m", "3", "http://"+netAllowed+"/"); r.ExitCode == 0 {
		t.Fatalf("the clone without a network reaches %s: %+v", netAllowed, r)
	}
	d.vmWaitCount("n3", before+3)
	for _, id := range []string{"n2", "n3"} {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}

	// Release and resume of a networked clone: its network namespace, eth0 and the host's
	// side stay while QEMU is gone, across a SIGKILL of bothyd.
	const rel = "n1"
	relAddr, relMAC := d.vmAddress(rel), d.vmMAC(rel)
	begin = time.Now()
	if r := d.vmDo("POST", "/v1/sandboxes/"+rel+"/pause", jsonBody(t, map[string]any{"memory": "release"})); r.Status != 200 || !strings.Contains(string(r.Body), `"state":"paused"`) {
		t.Fatalf("pause with the memory released: %d %s", r.Status, r.Body)
	}
	t.Logf("pause of a networked clone with its memory released: %v", time.Since(begin))
	d.wantOnlyShim(vm, filepath.Join(d.Root, "sandboxes", rel))
	d.Restart(true)
	if rep, code, stderr := runCheckIn(t, w.host, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check beside a released networked microVM exited %d: %+v\n%s", code, rep, stderr)
	}
	w.noLeftovers(t, d, src, rel)
	begin = time.Now()
	if r := d.vmDo("POST", "/v1/sandboxes/"+rel+"/resume?timeout=600000", nil); r.Status != 200 {
		t.Fatalf("resume of a released networked microVM: %d %s", r.Status, r.Body)
	}
	t.Logf("resume of the released networked clone (restore, Setup, the join), after a restart of bothyd: %v", time.Since(begin))
	if got := d.vmAddress(rel); got != relAddr {
		t.Fatalf("the resumed clone has address %s; it had %s", got, relAddr)
	}
	if got := d.vmMAC(rel); got != relMAC {
		t.Fatalf("the resumed clone has MAC %s; it had %s", got, relMAC)
	}
	sb := decode[netSandboxJSON](t, d.vmDo("GET", "/v1/sandboxes/"+rel, nil), 200)
	if sb.Address != relAddr.String() {
		t.Fatalf("the resumed clone shows %+v; want address %s", sb, relAddr)
	}
	cpid, n := d.vmReadCount(rel)
	if cpid != pid {
		t.Fatalf("the resumed clone's counter is pid %d; was %d", cpid, pid)
	}
	d.vmWaitCount(rel, n+3)
	d.vmReaches(rel)
	if log := d.logs.String(); strings.Contains(log, "network: re-adopting") || strings.Contains(log, "network: joining") {
		t.Fatalf("the restarted bothyd failed to adopt a network:\n%s", log)
	}
	if rep, code, stderr := runCheckIn(t, w.host, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check after the resume exited %d: %+v\n%s", code, rep, stderr)
	}

	// The resume's crash windows, made by hand while bothyd is down (SIGKILLed while the
	// memory is released): the pause record removed and the VM still released (a crash before
	// the thaw: start-up's reconcile restores it and joins), and the VM restored too (a crash
	// before the join: the reattach adopts the network, pointing the join at the new tap).
	dir := filepath.Join(d.Root, "sandboxes", rel)
	for _, thawed := range []bool{false, true} {
		if r := d.vmDo("POST", "/v1/sandboxes/"+rel+"/pause", jsonBody(t, map[string]any{"memory": "release"})); r.Status != 200 {
			t.Fatalf("pause with the memory released: %d %s", r.Status, r.Body)
		}
		d.Kill()
		if err := os.Remove(filepath.Join(dir, "paused.json")); err != nil {
			t.Fatal(err)
		}
		if thawed {
			ctx, cancel := context.WithTimeout(context.Background(), vmDeadline)
			err := vm.Thaw(ctx, rel, dir)
			cancel()
			if err != nil {
				t.Fatalf("the resume's thaw, by hand: %v", err)
			}
		}
		d.start()
		// Before any request that could adopt it: start-up attached the network (a sandbox
		// shows its address only while this bothyd has it attached).
		if sb := decode[netSandboxJSON](t, d.vmDo("GET", "/v1/sandboxes/"+rel, nil), 200); sb.State != "running" || sb.Address != relAddr.String() {
			t.Fatalf("after a crash mid-resume (thawed %v) and the restart: %+v; want it running with address %s", thawed, sb, relAddr)
		}
		if got := d.vmAddress(rel); got != relAddr {
			t.Fatalf("after a crash mid-resume (thawed %v) the clone has address %s; it had %s", thawed, got, relAddr)
		}
		d.vmReaches(rel)
		if log := d.logs.String(); !thawed && !strings.Contains(log, "finishing an interrupted resume") || strings.Contains(log, "network: re-adopting") {
			t.Fatalf("start-up did not finish the interrupted resume, or logged a failed adoption:\n%s", log)
		}
		if rep, code, stderr := runCheckIn(t, w.host, d.Root); code != 0 || !rep.OK {
			t.Fatalf("bothyd check after a crash mid-resume (thawed %v) exited %d: %+v\n%s", thawed, code, rep, stderr)
		}
	}

	// A stop of a released networked microVM ends it with its network.
	if r := d.vmDo("POST", "/v1/sandboxes/"+rel+"/pause", jsonBody(t, map[string]any{"memory": "release"})); r.Status != 200 {
		t.Fatalf("pause with the memory released: %d %s", r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+rel+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop of a released networked microVM: %d %s", r.Status, r.Body)
	}
	w.noLeftovers(t, d, src)
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+rel, nil); r.Status != 204 {
		t.Fatalf("delete %s: %d %s", rel, r.Status, r.Body)
	}

	// A generation without a NIC (the source booted again without a network) cannot give a
	// networked clone one: there is no hot-plug.
	if r := d.vmDo("PUT", "/v1/sandboxes/"+src+"/network", jsonBody(t, map[string]any{})); r.Status != 200 {
		t.Fatalf("network {} of %s: %d %s", src, r.Status, r.Body)
	}
	if r := d.vmDo("POST", "/v1/sandboxes/"+src+"/stop?timeout=300000", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	decode[struct{}](t, d.vmDo("POST", "/v1/sandboxes/"+src+"/start?timeout=600000", nil), 200)
	g2 := decode[generationJSON](t, d.vmDo("POST", "/v1/templates/netmem/generations?timeout=600000", jsonBody(t, map[string]any{"sandbox": src})), 201)
	p := wantProblem(t, d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
		"id": "n4", "template": "netmem", "generation": g2.ID, "runtime": "microvm", "start": true, "network": policy})), 503, "unavailable")
	if !strings.Contains(p.Detail, "without a network interface") {
		t.Fatalf("the refusal of a networked clone of a generation without a NIC: %s", p.Detail)
	}
	if r := d.vmDo("GET", "/v1/sandboxes/n4", nil); r.Status != 404 {
		t.Fatalf("the refused clone exists: %d %s", r.Status, r.Body)
	}

	d.vmDo("POST", "/v1/sandboxes/"+src+"/stop?force=true", nil)
	if r := d.vmDo("DELETE", "/v1/sandboxes/"+src, nil); r.Status != 204 {
		t.Fatalf("delete %s: %d %s", src, r.Status, r.Body)
	}
	if left, err := vm.Processes(d.Root); err != nil || len(left) != 0 {
		t.Fatalf("microVM processes after the deletes: %+v, %v", left, err)
	}
	w.noLeftovers(t, d)
	if rep, code, stderr := runCheckIn(t, w.host, d.Root); code != 0 || !rep.OK {
		t.Fatalf("bothyd check at the end exited %d: %+v\n%s", code, rep, stderr)
	}
}

// vmMAC is the MAC of the guest's eth0.
func (d *daemon) vmMAC(id string) string {
	d.t.Helper()
	out := strings.TrimSpace(d.vmExec(id, "cat", "/sys/class/net/eth0/address"))
	if _, err := net.ParseMAC(out); err != nil {
		d.t.Fatalf("the MAC of %s's eth0: %q: %v", id, out, err)
	}
	return out
}

// vmAddress is the one IPv4 address of microVM id's eth0, as its guest has it.
func (d *daemon) vmAddress(id string) netip.Addr {
	d.t.Helper()
	out := d.vmExec(id, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	f := strings.Fields(out)
	if len(f) < 4 || f[2] != "inet" || strings.Count(out, "\n") != 0 {
		d.t.Fatalf("the addresses of %s's eth0: %q; want one", id, out)
	}
	p, err := netip.ParsePrefix(f[3])
	if err != nil {
		d.t.Fatalf("the address of %s's eth0: %q", id, out)
	}
	return p.Addr()
}

// vmIdentities are the addresses and MACs a test's networked microVMs have, each its own.
type vmIdentities struct {
	addrs map[netip.Addr]string
	macs  map[string]string
}

// newVMIdentities starts the identities with the running microVM src's.
func (d *daemon) newVMIdentities(src string) (*vmIdentities, netip.Addr) {
	d.t.Helper()
	addr := d.vmAddress(src)
	return &vmIdentities{addrs: map[netip.Addr]string{addr: src}, macs: map[string]string{d.vmMAC(src): src}}, addr
}

// own fails unless microVM id's guest has the address its sandbox shows and neither that
// address nor its MAC is another's; it returns them, now id's.
func (d *daemon) own(ids *vmIdentities, id, shown string) (netip.Addr, string) {
	d.t.Helper()
	addr, err := netip.ParseAddr(shown)
	if err != nil {
		d.t.Fatalf("%s shows address %q", id, shown)
	}
	if other, ok := ids.addrs[addr]; ok {
		d.t.Fatalf("%s has address %s, as %s has", id, addr, other)
	}
	ids.addrs[addr] = id
	if got := d.vmAddress(id); got != addr {
		d.t.Fatalf("the guest of %s has address %s; the sandbox shows %s", id, got, addr)
	}
	mac := d.vmMAC(id)
	if other, ok := ids.macs[mac]; ok {
		d.t.Fatalf("%s has MAC %s on eth0, as %s has", id, mac, other)
	}
	ids.macs[mac] = id
	return addr, mac
}
