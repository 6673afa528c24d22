package tests

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestMicroVMNetwork boots one microVM inside the network tests' own small internet (see
// newNetWorld; nothing leaves the test's namespaces): started without a policy it has only
// lo, and a policy cannot give it an interface while it runs (refused, nothing recorded);
// started again with an allow-list its guest's eth0 has the sandbox's address, the allowed
// name resolves and its host answers, a name and a host the policy does not allow are refused
// and dropped, as for a namespace sandbox; a SIGKILL of bothyd and a restart keep all of
// it (the resolver re-armed), bothyd check is clean beside it, and stop and delete leave no
// network behind.
func TestMicroVMNetwork(t *testing.T) {
	requireRoot(t)
	vm := requireMicroVM(t)
	w := newNetWorld(t)
	d := startDaemon(t, w.daemon(), withArgs("--microvm-accel", vmAccel()))
	t.Cleanup(func() { reapMicroVMs(t, vm, d.Root) })

	const id = "vmnet"
	decode[struct{}](t, d.vmDo("POST", "/v1/sandboxes?timeout=600000", jsonBody(t, map[string]any{
		"id": id, "runtime": "microvm", "start": true, "resources": map[string]any{"memory_mb": 256},
	})), 201)
	t.Cleanup(func() {
		d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.vmDo("DELETE", "/v1/sandboxes/"+id, nil)
	})
	if got := d.vmExec(id, "ls", "/sys/class/net"); got != "lo" {
		t.Fatalf("a microVM without a policy has interfaces %q; want lo alone", got)
	}
	policy := map[string]any{"allow": []string{"allowed.test"}}
	p := wantProblem(t, d.vmDo("PUT", "/v1/sandboxes/"+id+"/network", jsonBody(t, policy)), 503, "unavailable")
	if !strings.Contains(p.Detail, "microvm") {
		t.Errorf("the live network change's refusal does not name the runtime: %s", p.Detail)
	}
	if r := d.vmDo("GET", "/v1/sandboxes/"+id, nil); r.Status != 200 || strings.Contains(string(r.Body), `"network"`) {
		t.Fatalf("a refused network change was recorded: %d %s", r.Status, r.Body)
	}
	w.noLeftovers(t, d, id)

	// A start without and one with a network, of the same microVM (its assets made): the
	// figure of what the network adds (logged; TCG follows the machine's load).
	start := func(stopped func()) (netSandboxJSON, time.Duration) {
		t.Helper()
		if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
			t.Fatalf("stop: %d %s", r.Status, r.Body)
		}
		stopped()
		begin := time.Now()
		sb := decode[netSandboxJSON](t, d.vmDo("POST", "/v1/sandboxes/"+id+"/start?timeout=600000", nil), 200)
		return sb, time.Since(begin)
	}
	_, without := start(func() {})
	sb, with := start(func() {
		decode[struct{}](t, d.vmDo("PUT", "/v1/sandboxes/"+id+"/network", jsonBody(t, policy)), 200)
	})
	t.Logf("start of a stopped microVM to its agent's answer: without a network %v, with one %v", without, with)
	for line := range strings.Lines(d.logs.String()) {
		if strings.Contains(line, "network: attached") {
			t.Logf("the supervisor's network setup (Setup and the join): %s", strings.TrimSpace(line))
		}
	}
	addr, err := netip.ParseAddr(sb.Address)
	if err != nil || sb.State != "running" {
		t.Fatalf("the networked microVM shows %+v; want it running with an address", sb)
	}

	t.Run("allow-list", func(t *testing.T) {
		d := d.in(t)
		if got := d.vmExec(id, "ls", "/sys/class/net"); got != "eth0\nlo" {
			t.Fatalf("a networked microVM has interfaces %q; want eth0 and lo", got)
		}
		// The guest's NIC holds the sandbox's address: the namespace behind it only carries
		// frames.
		if got := d.vmExec(id, "cat", "/proc/net/fib_trie"); !strings.Contains(got, addr.String()) {
			t.Fatalf("the guest's addresses do not include %s:\n%s", addr, got)
		}
		d.vmReaches(id)
	})

	t.Run("kill-and-restart", func(t *testing.T) {
		d.Restart(true)
		d := d.in(t)
		d.vmReaches(id)
		// The restarted bothyd re-adopted the network (Setup and the join again), which
		// it only logs when it fails.
		if log := d.logs.String(); strings.Contains(log, "re-adopting a running sandbox's network") {
			t.Fatalf("the restarted bothyd failed to re-adopt the network:\n%s", log)
		}
		if rep, code, stderr := runCheckIn(t, w.host, d.Root); code != 0 || !rep.OK || rep.Running != 1 {
			t.Fatalf("bothyd check beside a networked microVM exited %d: %+v\n%s", code, rep, stderr)
		}
		w.noLeftovers(t, d, id)
	})

	t.Run("killed-mid-setup", func(t *testing.T) {
		// bothyd SIGKILLed once the veth of a start exists: while the guest's NIC is
		// configured, or just after the launch committed. Either way the restarted bothyd
		// leaves a consistent sandbox: stopped with no network and no process (and it starts
		// again, networked), or running and reachable.
		v := d.in(t)
		if r := v.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
			t.Fatalf("stop: %d %s", r.Status, r.Body)
		}
		w.noLeftovers(t, v)
		// The start's answer never comes (bothyd dies under it), so it is sent aside.
		url, token, client := v.URL, v.Token, v.httpClient()
		go func() {
			req, err := http.NewRequest("POST", url+"/v1/sandboxes/"+id+"/start?timeout=600000", nil)
			if err != nil {
				return
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		hh := nsHandle(t, w.host)
		waitFor(t, vmDeadline, "the start's veth", func() bool {
			links, err := hh.LinkList()
			if err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(links, func(l netlink.Link) bool { return strings.HasPrefix(l.Attrs().Name, "sbxd") })
		})
		d.Restart(true) // the outer daemon: the later subtests reach the restarted one
		v = d.in(t)
		sb := decode[netSandboxJSON](t, v.vmDo("GET", "/v1/sandboxes/"+id, nil), 200)
		switch sb.State {
		case "running":
			t.Logf("the kill came after the launch committed")
			v.vmReaches(id)
			w.noLeftovers(t, v, id)
		case "stopped":
			t.Logf("the kill came before the launch committed")
			w.noLeftovers(t, v)
			if left, err := vm.Processes(v.Root); err != nil || len(left) != 0 {
				t.Fatalf("microVM processes of the ended launch: %+v, %v", left, err)
			}
			// The interrupted start leaves nothing in the way of the next one.
			decode[netSandboxJSON](t, v.vmDo("POST", "/v1/sandboxes/"+id+"/start?timeout=600000", nil), 200)
			v.vmReaches(id)
		default:
			t.Fatalf("after the kill and a restart the sandbox is %+v", sb)
		}
		if rep, code, stderr := runCheckIn(t, w.host, v.Root); code != 0 || !rep.OK {
			t.Fatalf("bothyd check after the kill exited %d: %+v\n%s", code, rep, stderr)
		}
	})

	t.Run("stop-and-delete", func(t *testing.T) {
		d := d.in(t)
		if r := d.vmDo("POST", "/v1/sandboxes/"+id+"/stop?timeout=300000", nil); r.Status != 200 {
			t.Fatalf("stop: %d %s", r.Status, r.Body)
		}
		w.noLeftovers(t, d)
		if r := d.vmDo("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete: %d %s", r.Status, r.Body)
		}
		if left, err := vm.Processes(d.Root); err != nil || len(left) != 0 {
			t.Fatalf("microVM processes after the delete: %+v, %v", left, err)
		}
		w.noLeftovers(t, d)
	})
}

// vmReaches checks the policy {allow: [allowed.test]} from inside microVM id, with the guest's
// own tools (its host image has no Python): the allowed name resolves through the gateway's
// resolver and its host answers; another name is refused and its host's address dropped
// (curl's timeout, where a host that does not listen would refuse at once).
func (d *daemon) vmReaches(id string) {
	d.t.Helper()
	if got := d.vmExec(id, "getent", "ahostsv4", "allowed.test"); !strings.HasPrefix(got, netAllowed+" ") {
		d.t.Fatalf("allowed.test resolves in %s to %q; want %s", id, got, netAllowed)
	}
	if got := d.vmExec(id, "curl", "-sS", "-m", "20", "http://allowed.test/"); got != "hello from "+netAllowed+":80" {
		d.t.Fatalf("GET http://allowed.test/ from %s = %q", id, got)
	}
	if r := d.vmRun(id, "getent", "ahostsv4", "other.test"); r.ExitCode == 0 {
		d.t.Fatalf("other.test resolves in %s: %+v; want it refused", id, r)
	}
	if r := d.vmRun(id, "curl", "-sS", "-m", "3", "http://"+netOther+"/"); r.ExitCode != 28 {
		d.t.Fatalf("GET %s from %s: %+v; want it dropped (curl's timeout, exit 28)", netOther, id, r)
	}
}

// vmRun runs argv in the microVM and returns its result, whatever its exit.
func (d *daemon) vmRun(id string, argv ...string) execJSON {
	d.t.Helper()
	return decode[execJSON](d.t, d.vmDo("POST", "/v1/sandboxes/"+id+"/exec", jsonBody(d.t, map[string]any{"command": argv})), 200)
}
