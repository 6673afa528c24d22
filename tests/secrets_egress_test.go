package tests

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/bothy/bothy/egress"
	"github.com/bothy/bothy/platform"
)

// tlsHost is an HTTPS server in the test's internet, on port 443 of addr, with a certificate
// for any name signed by the test's CA; it keeps what each request carried.
type tlsHost struct {
	mu   sync.Mutex
	seen []string // each request's Authorization, X-Api-Key and body, one line each
}

func serveTLSIn(t *testing.T, ns *os.File, addr string, ca *egress.CA) *tlsHost {
	t.Helper()
	h := &tlsHost{}
	var ln net.Listener
	if err := runInNS(ns, func() (err error) { ln, err = net.Listen("tcp4", addr+":443"); return err }); err != nil {
		t.Fatal(err)
	}
	tln := tls.NewListener(ln, &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.Leaf(hi.ServerName)
	}})
	s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		h.mu.Lock()
		h.seen = append(h.seen, fmt.Sprintf("auth=%s key=%s body=%s", r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), body))
		h.mu.Unlock()
		// The answer echoes what came, as an API that quotes a bad key in its error does.
		fmt.Fprintf(w, "got auth=%s", r.Header.Get("Authorization"))
	})}
	go s.Serve(tln)
	t.Cleanup(func() { s.Close() })
	return h
}

func (h *tlsHost) last(t *testing.T) string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.seen) == 0 {
		t.Fatal("the host got no request")
	}
	return h.seen[len(h.seen)-1]
}

// egressClient runs in the sandbox: "send URL [CAFILE]" POSTs to URL with the placeholder of
// API_KEY in its Authorization header and its body, verifying the host with the default
// trust store (SSL_CERT_FILE), or CAFILE, and prints the answer; "hold" does the same to
// allowed.test, then leaves a child that keeps its memory and sleeps, and prints its pid.
const egressClient = `
import os, ssl, sys, urllib.request, time
p = os.environ['BOTHY_SECRET_API_KEY']
def send(url, cafile=None):
    ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    req = urllib.request.Request(url, data=('token=' + p).encode(), headers={'Authorization': 'Bearer ' + p})
    return urllib.request.urlopen(req, context=ctx, timeout=10).read().decode()
if sys.argv[1] == 'send':
    print(send(*sys.argv[2:4]))
else:
    answer = send('https://allowed.test/')
    pid = os.fork()
    if pid == 0:
        os.setsid()
        for fd in (0, 1, 2):
            os.close(fd)
        time.sleep(300)
        os._exit(0)
    print('pid=%d answer=%s' % (pid, answer))
`

// TestSecretsAtEgress: a sandbox whose policy binds a secret to allowed.test sends its
// placeholder over HTTPS; allowed.test gets the value (in the bound header, the Authorization
// header and the body), other.test gets the placeholder unchanged, through a connection the
// proxy does not intercept; the sandbox's environment, its files, a template captured from it
// and the memory of every process in it hold no trace of the value, and an answer that echoes
// the value gives the sandbox its placeholder; a rotation takes effect at the next request;
// a delete of the bound secret is refused.
func TestSecretsAtEgress(t *testing.T) {
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
	other := serveTLSIn(t, w.inet, netOther, testCA)
	d := startDaemon(t, w.daemon(), withArgs("--egress-ca-file", caFile))

	const value = "sk-egress-3a7bd3e2360a3d29eea436fcfb7e44c7"
	const rotated = "sk-egress-rotated-0d9f6c1b2e8a4f7d"
	decode[secretJSON](t, d.doJSON("POST", "/v1/secrets", map[string]any{"name": "API_KEY", "value": value}), 201)
	policy := map[string]any{"allow": []string{"allowed.test", "other.test"}, "secrets": map[string]any{
		"API_KEY": map[string]any{"hosts": []string{"allowed.test"}, "header": map[string]any{"name": "X-Api-Key", "value": "Key {value}"}},
	}}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "nosecret", "network": map[string]any{
		"allow": []string{"allowed.test"}, "secrets": map[string]any{"MISSING": map[string]any{"hosts": []string{"allowed.test"}}}}}), 404, "secret-not-found")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "badheader", "network": map[string]any{
		"allow": []string{"allowed.test"}, "secrets": map[string]any{"API_KEY": map[string]any{"hosts": []string{"allowed.test"},
			"header": map[string]any{"name": "Content-Length", "value": "{value}"}}}}}), 400, "invalid-request")
	d.createNet("sec", policy)

	env := d.exec("sec", map[string]any{"command": []string{"env"}})
	placeholder := ""
	for _, line := range strings.Split(env.Stdout, "\n") {
		if v, ok := strings.CutPrefix(line, "BOTHY_SECRET_API_KEY="); ok {
			placeholder = v
		}
	}
	if !strings.HasPrefix(placeholder, "bothy-secret-") || !strings.Contains(env.Stdout, "SSL_CERT_FILE=") {
		t.Fatalf("the sandbox's environment has no placeholder or CA bundle:\n%s", env.Stdout)
	}
	if strings.Contains(env.Stdout, value) {
		t.Fatal("the sandbox's environment holds the value")
	}

	send := func(args ...string) string {
		t.Helper()
		r := d.exec("sec", map[string]any{"command": append([]string{"/usr/bin/python3", "-c", egressClient}, args...), "timeout_ms": 30000})
		if r.ExitCode != 0 {
			t.Fatalf("the client %v: exit %d: %s", args, r.ExitCode, r.Stderr)
		}
		return strings.TrimSpace(r.Stdout)
	}
	answer := send("send", "https://allowed.test/")
	want := fmt.Sprintf("auth=Bearer %s key=Key %s body=token=%s", value, value, value)
	if got := allowed.last(t); got != want {
		t.Fatalf("allowed.test got %q; want %q", got, want)
	}
	if answer != "got auth=Bearer "+placeholder {
		t.Fatalf("the sandbox got the answer %q; want the echo with its placeholder back", answer)
	}

	// The test CA's certificate goes into the sandbox as a file of its own: other.test's
	// connection is spliced, so the sandbox sees other.test's own certificate.
	if r := d.do("PUT", "/v1/sandboxes/sec/files?path=/tmp/test-ca.pem", bytes.NewReader(testCA.CertPEM()),
		http.Header{"Content-Type": {"application/octet-stream"}}); r.Status/100 != 2 {
		t.Fatalf("uploading the test CA: %d %s", r.Status, r.Body)
	}
	send("send", "https://other.test/", "/tmp/test-ca.pem")
	if got, want := other.last(t), fmt.Sprintf("auth=Bearer %s key= body=token=%s", placeholder, placeholder); got != want {
		t.Fatalf("other.test got %q; want the placeholder unchanged, %q", got, want)
	}

	wantProblem(t, d.do("DELETE", "/v1/secrets/API_KEY", nil, nil), 409, "secret-in-use")

	// A connection straight to the proxy's listener on the gateway has no destination the
	// filter redirected: it is closed without a dial, whatever it asks for.
	allowed.mu.Lock()
	before := len(allowed.seen)
	allowed.mu.Unlock()
	direct := d.exec("sec", map[string]any{"command": []string{"/usr/bin/python3", "-c", `
import socket
gw = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
c = socket.create_connection((gw, 15443), timeout=5)
c.sendall(b'GET / HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer ' + __import__('os').environ['BOTHY_SECRET_API_KEY'].encode() + b'\r\n\r\n')
try:
    print('read=%r' % c.recv(100))
except Exception as e:
    print('error=' + type(e).__name__)
`}, "timeout_ms": 20000})
	if got := strings.TrimSpace(direct.Stdout); got != "read=b''" && got != "error=ConnectionResetError" {
		t.Fatalf("a connection straight to the proxy: %q %s", got, direct.Stderr)
	}
	allowed.mu.Lock()
	after := len(allowed.seen)
	allowed.mu.Unlock()
	if after != before {
		t.Fatal("a connection straight to the proxy reached allowed.test")
	}

	decode[secretJSON](t, d.doJSON("POST", "/v1/secrets/API_KEY/rotate", map[string]any{"value": rotated}), 200)
	send("send", "https://allowed.test/")
	if got, want := allowed.last(t), fmt.Sprintf("auth=Bearer %s key=Key %s body=token=%s", rotated, rotated, rotated); got != want {
		t.Fatalf("after the rotation allowed.test got %q; want %q", got, want)
	}

	// A process that made a request stays, with its memory; then every process of the
	// sandbox is read whole.
	held := send("hold")
	if !strings.HasPrefix(held, "pid=") {
		t.Fatalf("hold: %q", held)
	}
	cg, err := platform.OpenCgroup(d.cgroupName("sec"))
	if err != nil {
		t.Fatal(err)
	}
	pids, err := cg.Pids()
	if err != nil || len(pids) < 2 {
		t.Fatalf("the sandbox's processes: %v, %v", pids, err)
	}
	for _, pid := range pids {
		for _, v := range []string{value, rotated} {
			if found, err := memoryHolds(pid, []byte(v)); err != nil {
				t.Errorf("reading the memory of %d: %v", pid, err)
			} else if found {
				t.Errorf("process %d of the sandbox holds a value in its memory", pid)
			}
		}
	}
	// The reader must be able to find what is there: the placeholder is in some process.
	foundPlaceholder := false
	for _, pid := range pids {
		if found, _ := memoryHolds(pid, []byte(placeholder)); found {
			foundPlaceholder = true
		}
	}
	if !foundPlaceholder {
		t.Fatal("no process of the sandbox holds the placeholder: the memory reader reads nothing")
	}

	// A template captured from the sandbox, and the whole state root with the sandbox's
	// files, hold no trace of either value.
	d.doJSON("POST", "/v1/sandboxes/sec/stop?force=true", nil)
	d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": "sec-tpl"})
	decode[generationJSON](t, d.doJSON("POST", "/v1/templates/sec-tpl/generations", map[string]any{"sandbox": "sec"}), 201)
	noTraceUnder(t, d.Root, value)
	noTraceUnder(t, d.Root, rotated)
	if strings.Contains(d.logs.String(), "sk-egress") {
		t.Error("the log holds a value")
	}
	// The stopped sandbox's redirections went with its network.
	w.noLeftovers(t, d)
}

// memoryHolds reports whether the readable memory of pid holds needle, read from
// /proc/PID/mem region by region as /proc/PID/maps lists them (what gcore would dump).
func memoryHolds(pid int, needle []byte) (bool, error) {
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return false, err
	}
	defer maps.Close()
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return false, err
	}
	defer mem.Close()
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[1][0] != 'r' || strings.HasSuffix(sc.Text(), "[vvar]") {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end-start > 1<<30 {
			continue
		}
		buf := make([]byte, end-start)
		n, _ := mem.ReadAt(buf, int64(start))
		if bytes.Contains(buf[:n], needle) {
			return true, nil
		}
	}
	return false, sc.Err()
}
