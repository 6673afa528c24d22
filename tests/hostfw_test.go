package tests

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// dockerFirewall is Docker's filter table as Docker 28 leaves it (FORWARD policy DROP, the
// DOCKER-USER jump first, its forward and isolation chains), made with iptables, Docker's
// own tool.
var dockerFirewall = [][]string{
	{"-P", "FORWARD", "DROP"},
	{"-N", "DOCKER-USER"},
	{"-N", "DOCKER-FORWARD"},
	{"-N", "DOCKER-ISOLATION-STAGE-1"},
	{"-N", "DOCKER-ISOLATION-STAGE-2"},
	{"-A", "FORWARD", "-j", "DOCKER-USER"},
	{"-A", "FORWARD", "-j", "DOCKER-FORWARD"},
	{"-A", "DOCKER-USER", "-j", "RETURN"},
	{"-A", "DOCKER-FORWARD", "-j", "DOCKER-ISOLATION-STAGE-1"},
	{"-A", "DOCKER-FORWARD", "-i", "docker0", "-j", "ACCEPT"},
	{"-A", "DOCKER-ISOLATION-STAGE-1", "-i", "docker0", "!", "-o", "docker0", "-j", "DOCKER-ISOLATION-STAGE-2"},
	{"-A", "DOCKER-ISOLATION-STAGE-2", "-o", "docker0", "-j", "DROP"},
}

// hostFirewallInfo is /v1/info's network.host_firewall.
func (d *daemon) hostFirewallInfo() (state, detail string) {
	d.t.Helper()
	var info struct {
		Network *struct {
			HostFirewall struct{ State, Detail string } `json:"host_firewall"`
		} `json:"network"`
	}
	r := d.doJSON("GET", "/v1/info", nil)
	if r.Status != 200 || json.Unmarshal(r.Body, &info) != nil || info.Network == nil {
		d.t.Fatalf("GET /v1/info: %d %s; want its network section", r.Status, r.Body)
	}
	return info.Network.HostFirewall.State, info.Network.HostFirewall.Detail
}

// firewallLines are bothyd's log lines about the host's firewall.
func (d *daemon) firewallLines() []string {
	var out []string
	for _, l := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(l, `"host_firewall":`) {
			out = append(out, l)
		}
	}
	return out
}

// TestNetworkBesideDocker runs bothyd in a namespace whose filter table is Docker's: without
// bothyd's rules there, a sandbox's allowed host is dropped by Docker's FORWARD policy. It
// shows the allowed host reached and another not, bothyd's rules once in DOCKER-USER across a
// SIGKILL and restart, the state in the start's log line and in /v1/info, and blocked when
// bothyd cannot open the firewall (no iptables in its PATH).
func TestNetworkBesideDocker(t *testing.T) {
	w := newNetWorld(t)
	ipt, err := exec.LookPath("iptables")
	if err != nil {
		t.Skipf("iptables is not installed (scripts/setup installs it): %v", err)
	}
	xt := func(args ...string) string {
		t.Helper()
		var out []byte
		err := runInNS(w.host, func() (err error) {
			out, err = exec.Command(ipt, append([]string{"-w"}, args...)...).CombinedOutput()
			return err
		})
		if err != nil {
			t.Fatalf("iptables %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	ours := func() []string {
		var rules []string
		for _, l := range strings.Split(xt("-S"), "\n") {
			if strings.Contains(l, "--comment bothy-") {
				rules = append(rules, l)
			}
		}
		return rules
	}
	for _, r := range dockerFirewall {
		xt(r...)
	}

	top := startDaemon(t, w.daemon())
	d := top.in(t)
	if st, detail := d.hostFirewallInfo(); st != "ok" || !strings.Contains(detail, "DOCKER-USER") {
		t.Fatalf("/v1/info's host_firewall = %s %q; want ok, at DOCKER-USER", st, detail)
	}
	if lines := d.firewallLines(); len(lines) != 1 || !strings.Contains(lines[0], `"host_firewall":"ok"`) {
		t.Fatalf("bothyd's lines about the host's firewall: %q; want one, ok", lines)
	}
	// Made through top, whose address follows its restarts, so that the cleanup finds it.
	top.createNet("box", map[string]any{"allow": []string{"allowed.test"}})
	d.resolves("box", "allowed.test", netAllowed)
	d.reaches("box", netAllowed, 80)
	d.dropped("box", netOther, 80)
	want := []string{
		"-A DOCKER-USER -i sbxd+ -m comment --comment bothy-sandboxes-out -j ACCEPT",
		"-A DOCKER-USER -o sbxd+ -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment bothy-sandboxes-replies -j ACCEPT",
	}
	if got := ours(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("bothyd's rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if lines := d.firewallLines(); len(lines) != 1 {
		t.Fatalf("bothyd's lines about the host's firewall after a setup: %q; want the start's alone", lines)
	}

	// A SIGKILL and a restart leave them once.
	top.Restart(true)
	d = top.in(t)
	if got := ours(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after a SIGKILL and a restart, bothyd's rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	d.resolves("box", "allowed.test", netAllowed)
	d.reaches("box", netAllowed, 80)
	d.dropped("box", netOther, 80)

	// Without bothyd's rules, and without iptables to put them back, Docker's policy drops
	// the allowed host, and bothyd says so.
	top.Stop()
	for _, l := range ours() {
		xt(append([]string{"-D"}, strings.Fields(strings.TrimPrefix(l, "-A "))...)...)
	}
	// iptables lives in /usr/sbin; nothing else bothyd runs does.
	t.Setenv("PATH", "/usr/bin:/bin")
	if _, err := exec.LookPath("iptables"); err == nil {
		t.Skip("iptables is in /usr/bin or /bin here, so bothyd cannot be started without it")
	}
	top.start()
	d = top.in(t)
	if st, detail := d.hostFirewallInfo(); st != "blocked" || !strings.Contains(detail, "install iptables") {
		t.Fatalf("without iptables, /v1/info's host_firewall = %s %q; want blocked, saying to install iptables", st, detail)
	}
	if lines := d.firewallLines(); len(lines) != 1 || !strings.Contains(lines[0], `"host_firewall":"blocked"`) {
		t.Fatalf("bothyd's lines about the host's firewall without iptables: %q; want one, blocked", lines)
	}
	d.dropped("box", netAllowed, 80)
}
