package tests

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bothy/bothy/egress"
)

// addressClient runs in the sandbox: "resolve NAME" prints the address NAME resolves to;
// "send ADDR NAME" connects to port 443 of ADDR with no lookup at all, as a process that
// resolved the name once and keeps the address does, speaks TLS for NAME and sends one request
// with the placeholder of API_KEY in its Authorization header, and prints the answer's body.
const addressClient = `
import os, socket, ssl, sys
if sys.argv[1] == 'resolve':
    print(socket.gethostbyname(sys.argv[2]))
    sys.exit(0)
addr, name = sys.argv[2], sys.argv[3]
p = os.environ['BOTHY_SECRET_API_KEY']
raw = socket.create_connection((addr, 443), timeout=10)
c = ssl.create_default_context().wrap_socket(raw, server_hostname=name)
c.sendall(('GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n' % (name, p)).encode())
data = b''
while True:
    b = c.recv(65536)
    if not b:
        break
    data += b
print(data.split(b'\r\n\r\n', 1)[-1].decode())
`

// TestSecretsAtEgressAcrossRestart: a sandbox that resolved a bound name before bothyd was
// SIGKILLed and restarted, and connects to the address it got without resolving again, still
// meets the egress proxy: the host gets the value, not the placeholder. The adoption keeps
// what the sandbox's resolver pinned and intercepted (network.Target.Adopt); without that,
// a sandbox allowed the name alone had its connection dropped (its pin gone), and one with the
// whole internet sent it straight out, with the placeholder (TLS to allowed.test, whose
// certificate the sandbox does not trust, fails first here).
func TestSecretsAtEgressAcrossRestart(t *testing.T) {
	w := newNetWorld(t)
	testCA, err := egress.LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "test-ca.pem")
	if err := os.WriteFile(caFile, testCA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	allowed := serveTLSIn(t, w.inet, netAllowed, testCA)
	d := startDaemon(t, w.daemon(), withArgs("--egress-ca-file", caFile))

	const value = "sk-restart-5c1e9a7f3b2d4e6a8c0f1b3d5e7a9c2e"
	decode[secretJSON](t, d.doJSON("POST", "/v1/secrets", map[string]any{"name": "API_KEY", "value": value}), 201)
	// "named" allows allowed.test by name, so its address is reachable through the pin its
	// resolver made; "open" has the whole internet, so only the intercept entry tells its
	// connection from one that goes straight out.
	binding := map[string]any{"API_KEY": map[string]any{"hosts": []string{"allowed.test"}}}
	d.createNet("named", map[string]any{"allow": []string{"allowed.test"}, "secrets": binding})
	d.createNet("open", map[string]any{"internet": true, "secrets": binding})
	run := func(id string, args ...string) string {
		t.Helper()
		r := d.exec(id, map[string]any{"command": append([]string{"/usr/bin/python3", "-c", addressClient}, args...), "timeout_ms": 30000})
		if r.ExitCode != 0 {
			t.Fatalf("the client %v in %s: exit %d: %s", args, id, r.ExitCode, r.Stderr)
		}
		return strings.TrimSpace(r.Stdout)
	}
	want := fmt.Sprintf("auth=Bearer %s key= body=", value)
	addrs := map[string]string{}
	for _, id := range []string{"named", "open"} {
		addr := run(id, "resolve", "allowed.test")
		if _, err := netip.ParseAddr(addr); err != nil {
			t.Fatalf("allowed.test resolved in %s to %q: %v", id, addr, err)
		}
		addrs[id] = addr
		run(id, "send", addr, "allowed.test")
		if got := allowed.last(t); got != want {
			t.Fatalf("before the restart allowed.test got %q from %s; want %q", got, id, want)
		}
	}

	d.Restart(true)

	// The same address, no lookup: the request still goes through the proxy.
	for _, id := range []string{"named", "open"} {
		run(id, "send", addrs[id], "allowed.test")
		if got := allowed.last(t); got != want {
			t.Fatalf("after a SIGKILL and restart of bothyd allowed.test got %q from %s; want %q", got, id, want)
		}
	}

	// A rotation through the CLI, its value piped with the line break echo adds: the host gets
	// the new value without it, at the next request, on the same address.
	const rotated = "sk-restart-rotated-8e2f4a6c0b1d3e5f7a9c"
	if out := d.ctlOK(rotated+"\n", "secret", "rotate", "API_KEY", "--value-stdin"); out != "API_KEY\n" {
		t.Fatalf("bothy secret rotate: %q", out)
	}
	run("named", "send", addrs["named"], "allowed.test")
	if got, want := allowed.last(t), fmt.Sprintf("auth=Bearer %s key= body=", rotated); got != want {
		t.Fatalf("after bothy secret rotate allowed.test got %q; want %q", got, want)
	}
	d.wantFail(1, "named", "secret", "rm", "API_KEY")
	for _, v := range []string{value, rotated} {
		if strings.Contains(d.logs.String(), v) {
			t.Error("the log holds a value")
		}
	}
}
