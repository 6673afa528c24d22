package registry_test

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/image"
	"github.com/bothy/bothy/store/image/registry"
)

// counted is a loopback registry that counts the requests it serves.
type counted struct {
	srv  *httptest.Server
	host string
	hits atomic.Int32
}

func countedRegistry(t *testing.T) *counted {
	t.Helper()
	c := &counted{}
	inner := ggcrregistry.New()
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.hits.Add(1)
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(c.srv.Close)
	c.host = strings.TrimPrefix(c.srv.URL, "http://")
	return c
}

// hubTransport carries Docker Hub's requests to a loopback registry standing in for it, and
// every other request as it is, so that a test can tell which registry a pull asked.
type hubTransport struct{ hub string }

func (h hubTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.URL.Host {
	case "index.docker.io", "registry-1.docker.io", "docker.io":
		req = req.Clone(req.Context())
		req.URL.Scheme, req.URL.Host, req.Host = "http", h.hub, h.hub
	}
	return http.DefaultTransport.RoundTrip(req)
}

// fromOf reads the file "from" of the one layer of src: which registry the layer came from.
func fromOf(t *testing.T, src *image.Source) string {
	t.Helper()
	if len(src.Layers) != 1 {
		t.Fatalf("%d layers; want 1", len(src.Layers))
	}
	rc, err := src.Layers[0].Open(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("the layer has no file from: %v", err)
		}
		if h.Name == "from" {
			b, _ := io.ReadAll(tr)
			return string(b)
		}
	}
}

// TestMirror: a pull of a Docker Hub reference goes to the mirror, layers included, when
// the mirror has the image; to Docker Hub when the mirror lacks it or cannot be reached;
// other registries are never mirrored, and a mirror's refusal other than a miss is the
// pull's error.
func TestMirror(t *testing.T) {
	t.Parallel()
	hub, mirror := countedRegistry(t), countedRegistry(t)
	for ref, files := range map[string]string{
		mirror.host + "/library/tool:v1": "mirror",
		hub.host + "/library/tool:v1":    "hub",
		hub.host + "/team/only-hub:v2":   "hub only",
	} {
		if err := remote.Write(mustRef(t, ref), imageOf(t, runtime.GOARCH, map[string]string{"from": files})); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := registry.New(registry.Options{Mirror: mirror.host, Transport: hubTransport{hub.host}})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		from              string
		mirrorHit, hubHit bool
	}
	pull := func(ref string) result {
		t.Helper()
		m, h := mirror.hits.Load(), hub.hits.Load()
		src, err := reg.Fetch(ctxT(t), ref)
		if err != nil {
			t.Fatalf("Fetch(%s): %v", ref, err)
		}
		if src.Ref != ref {
			t.Errorf("Fetch(%s).Ref = %s; want the reference asked for", ref, src.Ref)
		}
		from := fromOf(t, src)
		return result{from, mirror.hits.Load() > m, hub.hits.Load() > h}
	}

	// The mirror has it: nothing of it, layers included, comes from Docker Hub, whichever
	// way the reference names Docker Hub.
	for _, ref := range []string{"tool:v1", "library/tool:v1", "docker.io/library/tool:v1", "index.docker.io/library/tool:v1"} {
		if got := pull(ref); got != (result{"mirror", true, false}) {
			t.Errorf("%s with the mirror holding it: %+v; want all from the mirror", ref, got)
		}
	}
	// By digest too.
	d, err := reg.Fetch(ctxT(t), "tool:v1")
	if err != nil {
		t.Fatal(err)
	}
	if got := pull("tool@" + d.ManifestDigest); got != (result{"mirror", true, false}) {
		t.Errorf("by digest: %+v; want from the mirror", got)
	}

	// The mirror lacks it: asked first, then Docker Hub.
	if got := pull("team/only-hub:v2"); got != (result{"hub only", true, true}) {
		t.Errorf("with the mirror lacking it: %+v; want the mirror asked, then Docker Hub", got)
	}
	// Neither has it: Docker Hub's answer.
	if _, err := reg.Fetch(ctxT(t), "team/nowhere:v1"); errcode.Of(err) != errcode.ImageNotFound {
		t.Errorf("in neither: %v; want image-not-found", err)
	}

	// Another registry is not mirrored.
	if got := pull(hub.host + "/library/tool:v1"); got != (result{"hub", false, true}) {
		t.Errorf("a registry of its own: %+v; want the mirror not asked", got)
	}

	// A mirror that cannot be reached: Docker Hub.
	gone := httptest.NewServer(http.NotFoundHandler())
	goneHost := strings.TrimPrefix(gone.URL, "http://")
	gone.Close()
	unreachable, err := registry.New(registry.Options{Mirror: goneHost, Transport: hubTransport{hub.host}})
	if err != nil {
		t.Fatal(err)
	}
	src, err := unreachable.Fetch(ctxT(t), "tool:v1")
	if err != nil || fromOf(t, src) != "hub" {
		t.Errorf("with the mirror down: %v; want Docker Hub's image", err)
	}

	// A mirror that refuses access is the pull's error, not a reason to go around it.
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"errors":[{"code":"DENIED","message":"no"}]}`, http.StatusForbidden)
	}))
	defer refusing.Close()
	strict, err := registry.New(registry.Options{Mirror: strings.TrimPrefix(refusing.URL, "http://"), Transport: hubTransport{hub.host}})
	if err != nil {
		t.Fatal(err)
	}
	h := hub.hits.Load()
	if _, err := strict.Fetch(ctxT(t), "tool:v1"); errcode.Of(err) != errcode.Forbidden || !strings.Contains(err.Error(), "mirror") {
		t.Errorf("a refusing mirror: %v; want forbidden, naming the mirror", err)
	}
	if hub.hits.Load() != h {
		t.Error("a refusing mirror sent the pull to Docker Hub")
	}

	for _, bad := range []string{"https://mirror.example", "mirror.example/path", "UPPER case"} {
		if _, err := registry.New(registry.Options{Mirror: bad}); errcode.Of(err) != errcode.InvalidRequest {
			t.Errorf("Mirror %q: %v; want invalid-request", bad, err)
		}
	}
}
