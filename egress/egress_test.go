package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/bothy/bothy/platform"
)

const (
	placeholder = "bothy-secret-0123456789abcdef0123456789abcdef"
	value1      = "the-first-value"
	value2      = "the-second-value-after-rotation"
)

func TestReplacerAcrossReads(t *testing.T) {
	t.Parallel()
	pairs := []pair{{Old: placeholder, New: value1}, {Old: "bothy-secret-ffff", New: "X"}}
	var in strings.Builder
	var want strings.Builder
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		switch r.IntN(4) {
		case 0:
			in.WriteString(placeholder)
			want.WriteString(value1)
		case 1:
			in.WriteString("bothy-secret-ffff")
			want.WriteString("X")
		case 2:
			in.WriteString("bothy-secret-") // a prefix that never completes
			want.WriteString("bothy-secret-")
		default:
			s := strings.Repeat("a", r.IntN(50))
			in.WriteString(s)
			want.WriteString(s)
		}
	}
	cases := map[string]func(io.Reader) io.Reader{
		"whole":    func(r io.Reader) io.Reader { return r },
		"one byte": iotest.OneByteReader,
		"half":     iotest.HalfReader,
		"data+eof": iotest.DataErrReader,
	}
	for name, wrap := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := io.ReadAll(newReplacer(wrap(strings.NewReader(in.String())), pairs))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want.String() {
				t.Fatalf("replaced stream differs (len %d, want %d)", len(got), want.Len())
			}
		})
	}
}

func TestReplacerHoldsLittle(t *testing.T) {
	t.Parallel()
	rp := newReplacer(io.MultiReader(strings.NewReader(strings.Repeat("x", 10<<20)), strings.NewReader(placeholder)), []pair{{placeholder, value1}})
	buf := make([]byte, 4096)
	for {
		_, err := rp.Read(buf)
		if cap(rp.buf) > 2*chunkSize+len(placeholder) || cap(rp.out) > 2*chunkSize+len(placeholder) {
			t.Fatalf("the replacer holds %d+%d bytes", cap(rp.buf), cap(rp.out))
		}
		if err != nil {
			break
		}
	}
}

// world is a proxy with one sandbox, and TLS hosts behind it, all on loopback: the test plays
// the kernel's redirection by telling the proxy where each connection was going.
type world struct {
	t        testing.TB
	proxyCA  *CA
	hostCA   *CA
	sb       *Sandbox
	upstream net.Listener

	mu    sync.Mutex
	value string
	next  netip.AddrPort // the original destination of the next connection
	seen  []*http.Request
	body  []string
}

func newWorld(t testing.TB, maxConns int, bindings []Binding) *world {
	t.Helper()
	w := &world{t: t, value: value1}
	var err error
	if w.proxyCA, err = LoadCA(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if w.hostCA, err = LoadCA(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	// The hosts: one TLS server that shows a certificate for any name, signed by hostCA.
	w.upstream, err = tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return w.hostCA.Leaf(h.ServerName)
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bulk" {
			// The benchmarks' path: the body is counted, not kept, and the answer is as large
			// as asked.
			n, _ := io.Copy(io.Discard, r.Body)
			size, _ := strconv.Atoi(r.URL.Query().Get("size"))
			rw.Header().Set("X-Got", strconv.FormatInt(n, 10))
			chunk := bytes.Repeat([]byte("x"), 32<<10)
			for size > 0 {
				k := min(size, len(chunk))
				rw.Write(chunk[:k])
				size -= k
			}
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		w.seen = append(w.seen, r)
		w.body = append(w.body, string(b))
		w.mu.Unlock()
		fmt.Fprintf(rw, "host %s got %d bytes; echo %s", r.Host, len(b), r.Header.Get("X-Echo"))
	})}
	go srv.Serve(w.upstream)
	t.Cleanup(func() { srv.Close() })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(w.hostCA.CertPEM())
	p := New(Config{CA: w.proxyCA, Roots: roots, MaxConns: maxConns,
		Value: func(name string) (string, bool) {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.value, name == "KEY"
		},
		OriginalDst: func(net.Conn) (netip.AddrPort, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.next, nil
		}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.next = netip.MustParseAddrPort(w.upstream.Addr().String())
	w.sb = p.Serve("sbx-test", ln, bindings, func(dst netip.AddrPort) bool {
		return dst.String() == w.upstream.Addr().String()
	})
	t.Cleanup(func() { w.sb.Close() })
	return w
}

// client is the sandbox's HTTPS client, trusting the pool given.
func (w *world) client(roots ...*CA) *http.Client {
	pool := x509.NewCertPool()
	for _, ca := range roots {
		pool.AppendCertsFromPEM(ca.CertPEM())
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, DialContext: dialTo(w.sb.ln.Addr().String()), MaxIdleConnsPerHost: 4,
	}}
}

// dialTo dials addr whatever the address asked for, as the kernel's redirection does.
func dialTo(addr string) func(ctx context.Context, network, _ string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

func (w *world) last() (*http.Request, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) == 0 {
		w.t.Fatal("the host got no request")
	}
	return w.seen[len(w.seen)-1], w.body[len(w.body)-1]
}

var bindings = []Binding{{Secret: "KEY", Hosts: []string{"api.test", "*.wild.test"}, Placeholder: placeholder,
	Header: &Header{Name: "X-Api-Key", Value: "Key {value}"}}}

func TestInterceptsBoundHost(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, bindings)
	c := w.client(w.proxyCA)
	// A body that arrives in many small writes, a placeholder split between them.
	pr, pw := io.Pipe()
	go func() {
		body := "a=" + placeholder + "&b=" + strings.Repeat("z", 100000) + placeholder
		for i := 0; i < len(body); i += 7 {
			pw.Write([]byte(body[i:min(i+7, len(body))]))
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", "https://api.test/v1?k="+placeholder, pr)
	req.Header.Set("Authorization", "Bearer "+placeholder)
	req.Header.Set("X-Echo", placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got, body := w.last()
	if got.Header.Get("Authorization") != "Bearer "+value1 || got.Header.Get("X-Api-Key") != "Key "+value1 {
		t.Fatalf("headers upstream: %v", got.Header)
	}
	if got.URL.Query().Get("k") != value1 {
		t.Fatalf("query upstream: %s", got.URL.RawQuery)
	}
	if want := "a=" + value1 + "&b=" + strings.Repeat("z", 100000) + value1; body != want {
		t.Fatalf("body upstream: %d bytes, want %d; ends %q", len(body), len(want), body[max(0, len(body)-40):])
	}
	if strings.Contains(string(answer), value1) || !strings.Contains(string(answer), "echo "+placeholder) {
		t.Fatalf("the answer gives the value back: %s", answer)
	}

	// A rotation takes effect at the next request.
	w.mu.Lock()
	w.value = value2
	w.mu.Unlock()
	req, _ = http.NewRequest("GET", "https://api.test/", nil)
	req.Header.Set("Authorization", "Bearer "+placeholder)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got, _ := w.last(); got.Header.Get("Authorization") != "Bearer "+value2 {
		t.Fatalf("after a rotation: %v", got.Header)
	}

	// A name below a wildcard is bound too.
	req, _ = http.NewRequest("GET", "https://x.wild.test/", nil)
	req.Header.Set("Authorization", placeholder)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got, _ := w.last(); got.Header.Get("Authorization") != value2 {
		t.Fatalf("below a wildcard: %v", got.Header)
	}
}

func TestSplicesUnboundHost(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, bindings)
	// The sandbox trusts only the host's own CA: the connection is the host's, untouched.
	c := w.client(w.hostCA)
	req, _ := http.NewRequest("POST", "https://other.test/", strings.NewReader("p="+placeholder))
	req.Header.Set("Authorization", "Bearer "+placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got, body := w.last()
	if got.Header.Get("Authorization") != "Bearer "+placeholder || body != "p="+placeholder || got.Header.Get("X-Api-Key") != "" {
		t.Fatalf("an unbound host got %v %q", got.Header, body)
	}
	if resp.TLS == nil || verifiedBy(resp.TLS, w.proxyCA) || !verifiedBy(resp.TLS, w.hostCA) {
		t.Fatal("the unbound host's connection was intercepted")
	}
}

func verifiedBy(cs *tls.ConnectionState, ca *CA) bool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool})
	return err == nil
}

func TestRefusesMisdirectedHost(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, bindings)
	c := w.client(w.proxyCA)
	req, _ := http.NewRequest("GET", "https://api.test/", nil)
	req.Host = "evil.test"
	req.Header.Set("Authorization", placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("a Host that is not the server name: %d", resp.StatusCode)
	}
	w.mu.Lock()
	n := len(w.seen)
	w.mu.Unlock()
	if n != 0 {
		t.Fatal("a misdirected request reached a host")
	}
}

func TestUnverifiedHostGetsNoValue(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, bindings)
	w.sb.p.cfg.Roots = x509.NewCertPool() // the host's certificate is now unknown
	c := w.client(w.proxyCA)
	req, _ := http.NewRequest("GET", "https://api.test/", nil)
	req.Header.Set("Authorization", placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("an unverified host: %d", resp.StatusCode)
	}
	w.mu.Lock()
	n := len(w.seen)
	w.mu.Unlock()
	if n != 0 {
		t.Fatal("a host whose certificate did not verify got a request")
	}
}

func TestBoundsConnections(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2, bindings)
	addr := w.sb.ln.Addr().String()
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for w.sb.Refused() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a third connection was not refused")
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = bufio.NewReader(c).ReadByte()
		c.Close()
		if err == io.EOF {
			break
		}
	}
	if w.sb.Refused() == 0 {
		t.Fatal("no refusal counted")
	}
	// One place given back lets one more in.
	held[0].Close()
	c := w.client(w.proxyCA)
	waitOK := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.Get("https://api.test/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(waitOK) {
			t.Fatalf("after a place was given back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRefusesDestinationNotRedirected(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, bindings)
	// The connection claims to go to the proxy's own listener, as one made straight to it
	// does: it is closed, never dialled.
	w.mu.Lock()
	w.next = netip.MustParseAddrPort(w.sb.ln.Addr().String())
	w.mu.Unlock()
	c := w.client(w.proxyCA)
	if resp, err := c.Get("https://api.test/"); err == nil {
		resp.Body.Close()
		t.Fatalf("a connection to a destination not redirected was served: %d", resp.StatusCode)
	}
	w.mu.Lock()
	n := len(w.seen)
	w.mu.Unlock()
	if n != 0 {
		t.Fatal("a host got a request")
	}
}

func TestLeafCacheIsBounded(t *testing.T) {
	t.Parallel()
	ca, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	first, _ := ca.Leaf("a.test")
	again, _ := ca.Leaf("a.test")
	if first != again {
		t.Fatal("a leaf was not reused")
	}
	for i := range MaxLeaves + 10 {
		if _, err := ca.Leaf(fmt.Sprintf("h%d.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	if ca.lru.Len() != MaxLeaves || len(ca.leaves) != MaxLeaves {
		t.Fatalf("%d leaves kept", ca.lru.Len())
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	leaf, _ := ca.Leaf("b.test")
	cert, _ := x509.ParseCertificate(leaf.Certificate[0])
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "b.test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "c.test"}); err == nil {
		t.Fatal("a leaf verified for another name")
	}
}

func TestCAOutlivesReload(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	a, err := LoadCA(root)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadCA(root)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.CertPEM(), b.CertPEM()) {
		t.Fatal("a reload made another CA")
	}
	fi, err := os.Stat(filepath.Join(root, Dir, CAKeyName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the CA's key: %v, %v", fi, err)
	}
}

func TestLoadCARemovesLeftovers(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if _, err := LoadCA(root); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(root, Dir, platform.TempName(CAKeyName))
	if err := os.WriteFile(tmp, []byte("half a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	found, err := Check(root, false)
	if err != nil || len(found) != 1 {
		t.Fatalf("check: %v, %v", found, err)
	}
	if _, err := LoadCA(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("the leftover is still there: %v", err)
	}
}

func TestCloseEndsSplicedConnections(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 8, bindings)
	// other.test is spliced; the sandbox keeps its connection open, idle.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(w.hostCA.CertPEM())
	conn, err := tls.Dial("tcp", w.sb.ln.Addr().String(), &tls.Config{ServerName: "other.test", RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	done := make(chan struct{})
	go func() { w.sb.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a spliced connection the sandbox keeps open")
	}
}
