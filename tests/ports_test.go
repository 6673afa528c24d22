package tests

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// portService starts testdata/portserver.py in a sandbox (HTTP on 8000, TCP echo on 9000)
// and waits until it answers through the proxy. The sandbox has no network: only lo.
func (d *daemon) portService(id string) {
	d.t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		d.t.Skip("the port tests run python3 from the host's /usr, which has none")
	}
	script, err := os.ReadFile("testdata/portserver.py")
	if err != nil {
		d.t.Fatal(err)
	}
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	if r := d.do("PUT", "/v1/sandboxes/"+id+"/files?path=/home/user/portserver.py", bytes.NewReader(script), octet); r.Status != 204 {
		d.t.Fatalf("writing the service: %d %s", r.Status, r.Body)
	}
	// setsid: the service is no part of the exec's process group, which ends with it.
	if got := d.exec(id, map[string]any{"command": []string{"sh", "-c",
		"setsid python3 /home/user/portserver.py >/home/user/portserver.log 2>&1 </dev/null &"}}); got.ExitCode != 0 {
		d.t.Fatalf("starting the service: %+v", got)
	}
	waitFor(d.t, 30*time.Second, "the service in the sandbox to answer through the proxy", func() bool {
		return d.do("GET", "/v1/sandboxes/"+id+"/ports/8000/ready", nil, nil).Status == 200
	})
}

// echoed is what portserver.py answers an HTTP request with.
type echoed struct {
	Path    string            `json:"path"`
	Method  string            `json:"method"`
	Size    int               `json:"size"`
	Headers map[string]string `json:"headers"`
}

func wsURL(d *daemon, path string) string {
	return strings.Replace(d.URL, "http://", "ws://", 1) + path
}

func (d *daemon) authHeader() http.Header {
	h := http.Header{}
	if d.Token != "" {
		h.Set("Authorization", "Bearer "+d.Token)
	}
	return h
}

// TestPortProxy: HTTP and a websocket reach a service inside a sandbox without any network,
// through bothyd; the service sees no credential of the API; the proxy needs the token;
// nothing listening is port-unreachable; and an exec runs while a port connection is open.
func TestPortProxy(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("web", true)
	if got := d.exec("web", map[string]any{"command": []string{"sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}}); strings.TrimSpace(got.Stdout) != "lo" {
		t.Fatalf("the sandbox has interfaces %q, want lo alone", got.Stdout)
	}
	d.portService("web")

	r := d.do("GET", "/v1/sandboxes/web/ports/8000/some/path?x=1&access_token="+d.Token+"&y=%2F", nil, nil)
	var e echoed
	if err := json.Unmarshal(r.Body, &e); r.Status != 200 || err != nil {
		t.Fatalf("proxied GET: %d %s", r.Status, r.Body)
	}
	if e.Path != "/some/path?x=1&y=%2F" {
		t.Errorf("the service saw the path %q, want /some/path?x=1&y=%%2F (access_token removed)", e.Path)
	}
	for k, v := range e.Headers {
		if strings.EqualFold(k, "Authorization") || strings.Contains(v, d.Token) {
			t.Errorf("the service saw the API's credential in %s: %q", k, v)
		}
	}
	if e.Headers["X-Forwarded-For"] == "" || e.Headers["X-Forwarded-Prefix"] != "/v1/sandboxes/web/ports/8000" || e.Headers["Host"] != "127.0.0.1:8000" {
		t.Errorf("forwarding headers: %v", e.Headers)
	}
	if csp := r.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "sandbox") {
		t.Errorf("a proxied answer without a sandboxing CSP: %q", csp)
	}
	// A body streams through.
	body := bytes.Repeat([]byte("z"), 3<<20)
	r = d.do("POST", "/v1/sandboxes/web/ports/8000/upload", bytes.NewReader(body), http.Header{"Content-Type": {"application/octet-stream"}})
	if err := json.Unmarshal(r.Body, &e); r.Status != 200 || err != nil || e.Size != len(body) || e.Method != "POST" {
		t.Fatalf("proxied POST: %d %+v %v", r.Status, e, err)
	}

	wantProblem(t, d.do("GET", "/v1/sandboxes/web/ports/8000/", nil, http.Header{"Authorization": {"Bearer wrong"}}), 401, "unauthorized")
	wantProblem(t, d.do("GET", "/v1/sandboxes/web/ports/8001/", nil, nil), 502, "port-unreachable")
	wantProblem(t, d.do("GET", "/v1/sandboxes/nope/ports/8000/", nil, nil), 404, "sandbox-not-found")
	wantProblem(t, d.do("GET", "/v1/sandboxes/web/ports/99999/", nil, nil), 400, "invalid-request")

	// A websocket through the proxy, and an exec beside it (port traffic takes no exec lock).
	ws, _, err := websocket.DefaultDialer.Dial(wsURL(d, "/v1/sandboxes/web/ports/8000/ws"), d.authHeader())
	if err != nil {
		t.Fatalf("websocket through the proxy: %v", err)
	}
	defer ws.Close()
	roundTrip := func(msg string) {
		t.Helper()
		if err := ws.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		ws.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, got, err := ws.ReadMessage()
		if err != nil || string(got) != "echo:"+msg {
			t.Fatalf("websocket echo of %q: %q %v", msg, got, err)
		}
	}
	roundTrip("hello")
	hold := d.doJSON("POST", "/v1/sandboxes/web/exec", map[string]any{"command": []string{"sh", "-c", "echo side-by-side"}, "wait_ms": 1000})
	if hold.Status != 200 || !strings.Contains(string(hold.Body), "side-by-side") {
		t.Fatalf("an exec while a port connection is open: %d %s", hold.Status, hold.Body)
	}
	roundTrip("after the exec")

	// /v1/info shows the bounds.
	var info struct {
		Limits map[string]any `json:"limits"`
	}
	json.Unmarshal(d.do("GET", "/v1/info", nil, nil).Body, &info)
	if info.Limits["max_port_connections_per_sandbox"] == nil || info.Limits["max_port_connections"] == nil {
		t.Errorf("/v1/info lacks the port connection bounds: %v", info.Limits)
	}
}

// TestPortExecBesideLongRequest: an exec runs while a proxied request is in flight and an
// exec holds the lock while the proxy serves: neither waits for the other.
func TestPortExecBesideLongRequest(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("side", true)
	d.portService("side")
	// A long exec holds the exec lock; the proxy still answers meanwhile.
	done := make(chan response, 1)
	go func() {
		done <- d.doJSON("POST", "/v1/sandboxes/side/exec", map[string]any{"command": []string{"sh", "-c", "sleep 3; echo slept"}})
	}()
	waitFor(t, 10*time.Second, "the exec to hold the lock", func() bool {
		r := d.doJSON("POST", "/v1/sandboxes/side/exec", map[string]any{"command": []string{"true"}, "wait_ms": 1})
		return r.Status == 423
	})
	if r := d.do("GET", "/v1/sandboxes/side/ports/8000/during", nil, nil); r.Status != 200 {
		t.Fatalf("the proxy while an exec holds the lock: %d %s", r.Status, r.Body)
	}
	if r := <-done; r.Status != 200 || !strings.Contains(string(r.Body), "slept") {
		t.Fatalf("the long exec: %d %s", r.Status, r.Body)
	}
}

// TestPortTunnel: GET .../ports/{port}/tcp carries a byte stream both ways, in binary
// frames, and bothy port-forward serves it on a local port.
func TestPortTunnel(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("tcp", true)
	d.portService("tcp")
	ws, resp, err := websocket.DefaultDialer.Dial(wsURL(d, "/v1/sandboxes/tcp/ports/9000/tcp"), d.authHeader())
	d.reportDial(wsURL(d, "/v1/sandboxes/tcp/ports/9000/tcp"), resp)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	want := make([]byte, 4<<20)
	rand.Read(want)
	go func() {
		for off := 0; off < len(want); off += 100_000 {
			if err := ws.WriteMessage(websocket.BinaryMessage, want[off:min(off+100_000, len(want))]); err != nil {
				return
			}
		}
	}()
	var got []byte
	ws.SetReadDeadline(time.Now().Add(60 * time.Second))
	for len(got) < len(want) {
		typ, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
		if typ != websocket.BinaryMessage {
			t.Fatalf("a frame of type %d", typ)
		}
		got = append(got, b...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the echoed stream differs from what was sent")
	}
	// A closed port is refused before the upgrade.
	_, resp, err = websocket.DefaultDialer.Dial(wsURL(d, "/v1/sandboxes/tcp/ports/9001/tcp"), d.authHeader())
	d.reportDial(wsURL(d, "/v1/sandboxes/tcp/ports/9001/tcp"), resp)
	if err == nil || resp == nil || resp.StatusCode != 502 {
		t.Fatalf("a tunnel to a closed port: %v %v", resp, err)
	}

	// bothy port-forward: a local port that reaches the sandbox's 8000.
	local := freePort(t)
	cmd := exec.Command(bothyBin, "--url", d.URL, "--token-file", d.tokenFile(t), "port-forward", "tcp", strconv.Itoa(local)+":8000")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var resp2 *http.Response
	waitFor(t, 30*time.Second, "port-forward to serve", func() bool {
		// Not bothyd: bothy's local end of the forward, answering as the sandbox's service.
		resp2, err = http.Get(fmt.Sprintf("http://127.0.0.1:%d/forwarded", local))
		return err == nil
	})
	b, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	var e echoed
	if err := json.Unmarshal(b, &e); err != nil || e.Path != "/forwarded" {
		t.Fatalf("through port-forward: %s %v (output %s)", b, err, out.String())
	}
}

// freePort is a loopback port free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// tokenFile is a file holding the daemon's token, for bothy.
func (d *daemon) tokenFile(t *testing.T) string {
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte(d.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

type linkJSON struct {
	ID        string    `json:"id"`
	Token     string    `json:"token"`
	Path      string    `json:"path"`
	ExpiresAt time.Time `json:"expires_at"`
}

// TestPortLinks: a link works without the token, never as the API's token, expires, stops
// working when revoked, and survives a restart of bothyd, its revocation too.
func TestPortLinks(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("share", true)
	d.portService("share")
	mk := func(ttl int) linkJSON {
		t.Helper()
		return decode[linkJSON](t, d.doJSON("POST", "/v1/sandboxes/share/ports/8000/links", map[string]any{"ttl_s": ttl}), 201)
	}
	get := func(path string) response {
		t.Helper()
		req, _ := http.NewRequest("GET", d.URL+path, nil)
		client := d.checkedClient(&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }})
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
	}

	l := mk(600)
	if !strings.HasPrefix(l.Path, "/p/"+l.Token) {
		t.Fatalf("link %+v", l)
	}
	r := get(l.Path + "page?q=1")
	var e echoed
	if err := json.Unmarshal(r.Body, &e); r.Status != 200 || err != nil || e.Path != "/page?q=1" {
		t.Fatalf("through the link without a token: %d %s", r.Status, r.Body)
	}
	if r := get(strings.TrimSuffix(l.Path, "/")); r.Status != 301 || r.Header.Get("Location") != l.Path {
		t.Errorf("the link without its slash: %d %q", r.Status, r.Header.Get("Location"))
	}
	// The link is no credential of the API.
	wantProblem(t, d.do("GET", "/v1/sandboxes", nil, http.Header{"Authorization": {"Bearer " + l.Token}}), 401, "unauthorized")
	wantProblem(t, get("/v1/sandboxes?access_token="+l.Token), 401, "unauthorized")
	wantProblem(t, get("/p/"+l.Token[:len(l.Token)-2]+"xx/"), 404, "link-not-found")

	// Expiry.
	short := mk(1)
	waitFor(t, 30*time.Second, "the short link to expire", func() bool { return get(short.Path).Status == 404 })
	wantProblem(t, get(short.Path), 404, "link-not-found")

	// Revocation, across restarts.
	kept, gone := mk(600), mk(600)
	if r := d.do("DELETE", "/v1/sandboxes/share/ports/8000/links/"+gone.ID, nil, nil); r.Status != 204 {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	wantProblem(t, get(gone.Path), 404, "link-not-found")
	wantProblem(t, d.do("DELETE", "/v1/sandboxes/share/ports/8000/links/"+gone.ID, nil, nil), 404, "link-not-found")
	d.Restart(false)
	if r := get(kept.Path + "again"); r.Status != 200 {
		t.Fatalf("a link after a restart: %d %s", r.Status, r.Body)
	}
	wantProblem(t, get(gone.Path), 404, "link-not-found")
	if r := d.do("DELETE", "/v1/sandboxes/share/ports/8000/links/"+kept.ID, nil, nil); r.Status != 204 {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	d.Restart(true)
	wantProblem(t, get(kept.Path), 404, "link-not-found")
}

// directFigures measures, from inside the sandbox, what TestPortFigures measures through
// bothyd: n keep-alive GETs of 127.0.0.1:8000, and size bytes echoed by 127.0.0.1:9000.
const directFigures = `
import http.client, socket, sys, threading, time
n, size = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", 8000)
t = time.perf_counter()
for _ in range(n):
    c.request("GET", "/direct"); c.getresponse().read()
lat = (time.perf_counter() - t) / n
s = socket.create_connection(("127.0.0.1", 9000))
chunk = b"x" * 65536
def send():
    left = size
    while left > 0:
        s.sendall(chunk[:min(left, len(chunk))]); left -= len(chunk)
t = time.perf_counter()
threading.Thread(target=send).start()
got = 0
while got < size:
    got += len(s.recv(1 << 20))
print("%f %f" % (lat * 1000, size / (time.perf_counter() - t) / 1e6))
`

// TestPortFigures reports (does not assert) HTTP request latency and TCP throughput
// through the port proxy and tunnel against a direct connection from inside the sandbox,
// in the same run.
func TestPortFigures(t *testing.T) {
	requireRoot(t)
	d := startDaemon(t)
	d.create("fig", true)
	d.portService("fig")
	const n, size = 200, 32 << 20

	// Unchecked on purpose: a figure of the proxy's throughput, whose answers are the
	// sandbox's service's own (which the contract does not describe), measured unburdened.
	client := &http.Client{}
	start := time.Now()
	for range n {
		req, _ := http.NewRequest("GET", d.URL+"/v1/sandboxes/fig/ports/8000/proxied", nil)
		req.Header.Set("Authorization", "Bearer "+d.Token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("proxied GET: %d", resp.StatusCode)
		}
	}
	proxyLat := time.Since(start) / n

	ws, _, err := websocket.DefaultDialer.Dial(wsURL(d, "/v1/sandboxes/fig/ports/9000/tcp"), d.authHeader())
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	start = time.Now()
	go func() {
		for sent := 0; sent < size; sent += len(chunk) {
			if ws.WriteMessage(websocket.BinaryMessage, chunk) != nil {
				return
			}
		}
	}()
	got := 0
	for got < size {
		_, b, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("after %d bytes: %v", got, err)
		}
		got += len(b)
	}
	tunnelMBs := float64(size) / time.Since(start).Seconds() / 1e6

	r := d.exec("fig", map[string]any{"command": []string{"python3", "-c", directFigures, strconv.Itoa(n), strconv.Itoa(size)}, "timeout_ms": 120000})
	var directLat, directMBs float64
	if _, err := fmt.Sscanf(r.Stdout, "%f %f", &directLat, &directMBs); err != nil || r.ExitCode != 0 {
		t.Fatalf("the direct measurement: %+v", r)
	}
	t.Logf("HTTP GET latency: %.3f ms through the proxy, %.3f ms direct inside the sandbox", float64(proxyLat.Microseconds())/1000, directLat)
	t.Logf("TCP echo throughput: %.0f MB/s through the tunnel, %.0f MB/s direct inside the sandbox", tunnelMBs, directMBs)
}
