package egress

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// The proxy's cost against a direct connection, in the same run and on the same loopback:
// the round trip of a small request on a kept-alive connection, and the bytes per second of a
// large body each way. "direct" is the sandbox's client talking to the host itself; "proxy"
// goes through an interception (TLS terminated with the CA's leaf, placeholders replaced in
// headers and body, TLS again to the host); "splice" through the proxy for a host no secret
// is bound to.
//
//	go test -run '^$' -bench . -benchtime 2s ./egress/

// directClient talks to the host itself, as a sandbox would without the proxy.
func (w *world) directClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(w.hostCA.CertPEM())
	addr := w.upstream.Addr().String()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 4}
	tr.DialContext = dialTo(addr)
	return &http.Client{Timeout: 30 * time.Second, Transport: tr}
}

func benchClients(b *testing.B, w *world) map[string]*http.Client {
	return map[string]*http.Client{"direct": w.directClient(), "proxy": w.client(w.proxyCA), "splice": w.client(w.hostCA)}
}

// hostOf is the host name each client asks for: a bound one through the interception.
var hostOf = map[string]string{"direct": "api.test", "proxy": "api.test", "splice": "other.test"}

func BenchmarkRoundTrip(b *testing.B) {
	w := newWorld(b, DefaultMaxConns, bindings)
	for _, name := range []string{"direct", "proxy", "splice"} {
		c := benchClients(b, w)[name]
		b.Run(name, func(b *testing.B) {
			url := "https://" + hostOf[name] + "/bulk?size=64"
			for b.Loop() {
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("Authorization", "Bearer "+placeholder)
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

func BenchmarkThroughput(b *testing.B) {
	const size = 16 << 20
	w := newWorld(b, DefaultMaxConns, bindings)
	body := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	for _, dir := range []string{"upload", "download"} {
		for _, name := range []string{"direct", "proxy", "splice"} {
			c := benchClients(b, w)[name]
			b.Run(fmt.Sprintf("%s/%s", dir, name), func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					var req *http.Request
					if dir == "upload" {
						req, _ = http.NewRequest("POST", "https://"+hostOf[name]+"/bulk?size=0", bytes.NewReader(body))
					} else {
						req, _ = http.NewRequest("GET", fmt.Sprintf("https://%s/bulk?size=%d", hostOf[name], size), nil)
					}
					resp, err := c.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if (dir == "download" && n != size) || (dir == "upload" && resp.Header.Get("X-Got") != fmt.Sprint(size)) {
						b.Fatalf("%s moved %d bytes (host got %s)", dir, n, resp.Header.Get("X-Got"))
					}
				}
			})
		}
	}
}
