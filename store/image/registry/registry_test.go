package registry_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/image"
	"github.com/bothy/bothy/store/image/registry"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("unpacking layers needs root (chown, mknod); run the tests as root")
	}
}

func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for n, body := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	return buf.Bytes()
}

// imageOf builds an image for arch from a layer of files, the way the e2e tests will build
// theirs (from busybox, say).
func imageOf(t *testing.T, arch string, files map[string]string) v1.Image {
	t.Helper()
	data := tarOf(t, files)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"FROM=registry"}
	cf.Config.WorkingDir = "/srv"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

const (
	user, password, token = "alice", "s3cret", "the-token"
)

// tokenAuth puts a registry behind the token flow of the distribution protocol: /v2/ asks
// for a bearer token from /token, which hands one out for alice's basic credentials.
func tokenAuth(next http.Handler, blobGets *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
				http.Error(w, "bad credentials", http.StatusUnauthorized)
				return
			}
			json.NewEncoder(w).Encode(map[string]string{"token": token})
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+r.Host+`/token",service="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"token needed"}]}`, http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") && blobGets != nil {
			blobGets.Add(1)
		}
		next.ServeHTTP(w, r)
	})
}

func authFile(t *testing.T, host string) string {
	t.Helper()
	cfg := map[string]any{"auths": map[string]any{host: map[string]string{
		"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password)),
	}}}
	b, _ := json.Marshal(cfg)
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestPullFromLoopbackRegistry(t *testing.T) {
	needRoot(t)
	t.Parallel()
	var blobGets atomic.Int32
	srv := httptest.NewServer(tokenAuth(ggcrregistry.New(), &blobGets))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	// A manifest list: the host's image and one for another architecture.
	mine := imageOf(t, runtime.GOARCH, map[string]string{"which": "mine"})
	otherArch := "s390x"
	if runtime.GOARCH == otherArch {
		otherArch = "amd64"
	}
	theirs := imageOf(t, otherArch, map[string]string{"which": "theirs"})
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: theirs, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	ref := host + "/team/tool:v1"
	basic := remote.WithAuth(&staticAuth{})
	if err := remote.WriteIndex(mustRef(t, ref), idx, basic); err != nil {
		t.Fatal(err)
	}

	// Without credentials the registry refuses: the error says so.
	anon, err := registry.New(registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.Fetch(ctxT(t), ref); errcode.Of(err) != errcode.Forbidden {
		t.Fatalf("anonymous Fetch = %v; want forbidden", err)
	}

	reg, err := registry.New(registry.Options{AuthFile: authFile(t, host)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(t.TempDir(), image.Options{Fetcher: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var last image.LayerProgress
	img, err := s.Pull(ctxT(t), ref, "tool", func(p image.LayerProgress) { last = p })
	if err != nil {
		t.Fatal(err)
	}
	if last.Done != last.Total || last.Total <= 0 {
		t.Errorf("last progress = %+v; want the layer done, with its size", last)
	}
	want, _ := mine.Digest()
	if img.ManifestDigest != want.String() || img.Ref != ref || img.Config.WorkingDir != "/srv" || img.Config.Env[0] != "FROM=registry" {
		t.Errorf("image = %+v; want the host platform's manifest %s and its config", img, want)
	}
	dirs, err := s.LayerDirs("tool")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dirs[0], "which")); err != nil || string(b) != "mine" {
		t.Errorf("which = %q, %v; want the host platform's image", b, err)
	}
	gets := blobGets.Load()

	// By digest, and again: the layer is present, so no layer blob is downloaded.
	if _, err := s.Pull(ctxT(t), host+"/team/tool@"+want.String(), "tool2", nil); err != nil {
		t.Fatal(err)
	}
	if got := blobGets.Load() - gets; got != 1 {
		t.Errorf("a pull of present layers fetched %d blobs; want 1 (the configuration)", got)
	}
	if _, err := reg.Fetch(ctxT(t), host+"/team/missing:v1"); errcode.Of(err) != errcode.ImageNotFound {
		t.Errorf("Fetch of a missing image = %v; want image-not-found", err)
	}
}

// staticAuth is the pushing test's own credentials.
type staticAuth struct{}

func (*staticAuth) Authorization() (*authn.AuthConfig, error) {
	return &authn.AuthConfig{Username: user, Password: password}, nil
}

func TestPullRefusesTamperedBlob(t *testing.T) {
	needRoot(t)
	t.Parallel()
	img := imageOf(t, runtime.GOARCH, map[string]string{"f": "content"})
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	// The registry serves other bytes under the layer's digest.
	inner := ggcrregistry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
			rec := httptest.NewRecorder()
			inner.ServeHTTP(rec, r)
			body := rec.Body.Bytes()
			body[len(body)/2] ^= 0xff
			w.WriteHeader(rec.Code)
			w.Write(body)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/bad:v1"
	if err := remote.Write(mustRef(t, ref), img); err != nil {
		t.Fatal(err)
	}
	reg, _ := registry.New(registry.Options{})
	s, err := image.Open(t.TempDir(), image.Options{Fetcher: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Pull(ctxT(t), ref, "bad", nil)
	if err == nil {
		t.Fatal("a pull of a tampered layer succeeded")
	}
	if _, err := s.Get("bad"); err == nil {
		t.Error("a refused pull left an image record")
	}
	ps, err := s.Check(ctxT(t), false)
	if err != nil || len(ps) != 0 {
		t.Errorf("Check after a refused pull = %v, %v; want nothing half-unpacked", ps, err)
	}
}

func mustRef(t *testing.T, ref string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
