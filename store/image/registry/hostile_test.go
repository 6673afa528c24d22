package registry_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/image"
	"github.com/bothy/bothy/store/image/registry"
)

// hostile is a registry that breaks the bounds a pull holds registries to, one way per
// repository, counting the requests each repository draws.
type hostile struct {
	mu    sync.Mutex
	count map[string]int
}

const (
	hugeBytes  = 200 << 20 // a manifest or configuration far beyond the bounds, streamed
	manyLayers = 1000
)

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// goodConfig is a valid configuration of one layer.
var goodConfig = []byte(`{"os":"linux","architecture":"amd64","rootfs":{"type":"layers","diff_ids":["sha256:` + strings.Repeat("a", 64) + `"]}}`)

// manifestOf is an OCI manifest with a configuration of the given digest and size and
// layers of the given count.
func manifestOf(cfgDigest string, cfgSize int64, layers int, layerSize int64) []byte {
	type desc struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	}
	m := struct {
		SchemaVersion int    `json:"schemaVersion"`
		MediaType     string `json:"mediaType"`
		Config        desc   `json:"config"`
		Layers        []desc `json:"layers"`
	}{2, "application/vnd.oci.image.manifest.v1+json", desc{"application/vnd.oci.image.config.v1+json", cfgDigest, cfgSize}, nil}
	for i := range layers {
		m.Layers = append(m.Layers, desc{"application/vnd.oci.image.layer.v1.tar+gzip", digestOf(fmt.Appendf(nil, "layer %d", i)), layerSize})
	}
	b, _ := json.Marshal(m)
	return b
}

// stream writes n bytes of JSON-looking filler without holding them, until the client goes.
func stream(w http.ResponseWriter, n int64) {
	chunk := []byte(strings.Repeat(" ", 64<<10))
	for n > 0 {
		c := chunk
		if int64(len(c)) > n {
			c = c[:n]
		}
		if _, err := w.Write(c); err != nil {
			return
		}
		n -= int64(len(c))
	}
}

func (h *hostile) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v2/" {
		w.WriteHeader(http.StatusOK)
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v2/"), "/")
	if len(parts) != 3 {
		http.NotFound(w, r)
		return
	}
	repo, kind := parts[0], parts[1]
	h.mu.Lock()
	h.count[repo]++
	h.mu.Unlock()
	loop := func() {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		http.Redirect(w, r, scheme+"://"+r.Host+r.URL.Path, http.StatusFound)
	}
	manifest := func(b []byte) {
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Write(b)
	}
	switch {
	case repo == "loop" && kind == "manifests":
		loop()
	case repo == "downgrade" && kind == "manifests":
		// To another host: go-containerregistry itself turns a redirect to the
		// registry's own host back to its scheme.
		http.Redirect(w, r, "http://storage.example.com"+r.URL.Path, http.StatusFound)
	case repo == "huge" && kind == "manifests":
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		stream(w, hugeBytes) // chunked: no length to refuse up front
	case repo == "declared" && kind == "manifests":
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Content-Length", fmt.Sprint(hugeBytes))
		stream(w, hugeBytes)
	case repo == "bigconfig" && kind == "manifests":
		manifest(manifestOf(digestOf([]byte("big")), hugeBytes, 1, 10))
	case repo == "nosize" && kind == "manifests":
		manifest(manifestOf(digestOf([]byte("big")), -1, 1, 10))
	case repo == "many" && kind == "manifests":
		manifest(manifestOf(digestOf(goodConfig), int64(len(goodConfig)), manyLayers, 10))
	case repo == "blobloop" && kind == "manifests":
		manifest(manifestOf(digestOf(goodConfig), int64(len(goodConfig)), 1, 10))
	case kind == "blobs" && parts[2] == digestOf(goodConfig):
		w.Write(goodConfig)
	case repo == "blobloop" && kind == "blobs":
		loop()
	case kind == "blobs":
		stream(w, hugeBytes)
	default:
		http.NotFound(w, r)
	}
}

func (h *hostile) requests(repo string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count[repo]
}

// maxRequests is what one refused request may draw from a repository: itself and its
// redirects (the ping, /v2/, is not counted). A broken bound is not retried.
const maxRequests = registry.MaxRedirects + 1

func TestHostileRegistry(t *testing.T) {
	t.Parallel()
	h := &hostile{count: map[string]int{}}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	reg, err := registry.New(registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		repo string
		code errcode.Code
		msg  string
	}{
		{"loop", errcode.Unavailable, "more than 5 times"},
		{"huge", errcode.PayloadTooLarge, "manifest"},
		{"declared", errcode.PayloadTooLarge, "manifest"},
		{"bigconfig", errcode.PayloadTooLarge, "configuration"},
		{"nosize", errcode.PayloadTooLarge, "configuration of -1 bytes"},
		{"many", errcode.PayloadTooLarge, "1000 layers"},
	} {
		t.Run(tc.repo, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := reg.Fetch(ctx, host+"/"+tc.repo+":1")
			if err == nil {
				t.Fatal("the fetch succeeded")
			}
			if errcode.Of(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Fetch = %v (%s); want %s saying %q", err, errcode.Of(err), tc.code, tc.msg)
			}
			if tc.code == errcode.PayloadTooLarge && !errors.Is(err, image.ErrTooLarge) {
				t.Errorf("Fetch = %v; want it to wrap image.ErrTooLarge", err)
			}
			if n := h.requests(tc.repo); n > maxRequests {
				t.Errorf("the registry drew %d requests; want at most %d", n, maxRequests)
			}
		})
	}

	// A layer blob that redirects in a loop: the configuration reads, the layer does not.
	t.Run("blobloop", func(t *testing.T) {
		t.Parallel()
		src, err := reg.Fetch(ctxT(t), host+"/blobloop:1")
		if err != nil {
			t.Fatal(err)
		}
		rc, err := src.Layers[0].Open(ctxT(t))
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		if errcode.Of(err) != errcode.Unavailable || !strings.Contains(err.Error(), "redirected") {
			t.Errorf("reading the layer = %v; want unavailable: redirected", err)
		}
		if n := h.requests("blobloop"); n > 2+maxRequests {
			t.Errorf("the registry drew %d requests; want at most %d", n, 2+maxRequests)
		}
	})
}

// TestRedirectLeavingHTTPS: a registry spoken to over HTTPS may not send a pull to plain
// HTTP. The test's TLS server answers for example.com, whose name its certificate holds.
func TestRedirectLeavingHTTPS(t *testing.T) {
	t.Parallel()
	h := &hostile{count: map[string]int{}}
	srv := httptest.NewTLSServer(h)
	defer srv.Close()
	tr := srv.Client().Transport.(*http.Transport).Clone()
	addr := srv.Listener.Addr().String()
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	tr.TLSClientConfig = &tls.Config{RootCAs: tr.TLSClientConfig.RootCAs, ServerName: "example.com"}
	reg, err := registry.New(registry.Options{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	_, err = reg.Fetch(ctxT(t), "example.com/downgrade:1")
	if errcode.Of(err) != errcode.Unavailable || !strings.Contains(err.Error(), "not HTTPS") {
		t.Fatalf("Fetch = %v; want unavailable: not HTTPS", err)
	}
	if n := h.requests("downgrade"); n != 1 {
		t.Errorf("the registry drew %d requests; want 1 (the redirect is not followed)", n)
	}
}

// TestBlobRedirectToStorage: a registry that sends its blobs to a storage host, through two
// hops, as real ones do, still serves a pull.
func TestBlobRedirectToStorage(t *testing.T) {
	needRoot(t)
	t.Parallel()
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	storage := httptest.NewServer(inner)
	t.Cleanup(storage.Close)
	hop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, storage.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(hop.Close)
	var redirected atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			redirected.Add(1)
			http.Redirect(w, r, hop.URL+r.URL.Path, http.StatusTemporaryRedirect)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/app:v1"
	if err := remote.Write(mustRef(t, ref), imageOf(t, runtime.GOARCH, map[string]string{"f": "from storage"})); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(t.TempDir(), image.Options{Fetcher: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Pull(ctxT(t), ref, "app", nil); err != nil {
		t.Fatal(err)
	}
	if n := redirected.Load(); n != 2 {
		t.Errorf("%d blob requests were redirected; want 2 (the configuration and the layer)", n)
	}
}
