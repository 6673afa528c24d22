package tests

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestRegistryMirror: with --registry-mirror, a Docker Hub reference (no registry named) is
// pulled from the mirror when the mirror has it, and runs. The fallback to Docker Hub when the
// mirror lacks an image is tested in store/image/registry against a loopback stand-in for
// Docker Hub: an end-to-end test of it would send traffic off this host, which no test may.
func TestRegistryMirror(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	var mu sync.Mutex
	var asked []string
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Method+" "+r.URL.Path)
		mu.Unlock()
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(mirror.Close)
	host := strings.TrimPrefix(mirror.URL, "http://")
	img := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin", "FROM=mirror"}}, 0)
	pushRef, err := name.ParseReference(host+"/bothyd-test/busybox:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(pushRef, img); err != nil {
		t.Fatal(err)
	}
	wasAsked := func(path string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range asked {
			if strings.HasSuffix(a, path) {
				return true
			}
		}
		return false
	}

	d := startDaemon(t, withArgs("--registry-mirror", host))
	decode[imageJSON](t, d.doJSON("POST", "/v1/images", map[string]any{"ref": "bothyd-test/busybox:v1", "name": "mirrored"}), 202)
	got := d.waitImage("mirrored")
	want, _ := img.Digest()
	if got.Digest != want.String() || !wasAsked("/v2/bothyd-test/busybox/manifests/v1") {
		t.Fatalf("pulled %+v; want %s, from the mirror", got, want)
	}
	d.createOn("mirrored", "mirrored")
	if r := d.exec("mirrored", map[string]any{"command": []string{"sh", "-c", "echo $FROM"}}); r.Stdout != "mirror\n" {
		t.Fatalf("exec on the mirrored image: %+v", r)
	}
}
