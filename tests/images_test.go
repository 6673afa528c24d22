package tests

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type imageJSON struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	State  string `json:"state"`
	Digest string `json:"digest"`
	Error  string `json:"error"`
	Layers []struct {
		DiffID     string `json:"diff_id"`
		BytesDone  *int64 `json:"bytes_done"`
		BytesTotal *int64 `json:"bytes_total"`
	} `json:"layers"`
	SizeBytes int64 `json:"size_bytes"`
	Config    struct {
		Env        []string `json:"env"`
		WorkingDir string   `json:"working_dir"`
		User       string   `json:"user"`
	} `json:"config"`
	UsedBy []string `json:"used_by"`
}

// busyboxPrograms are the applets the image tests run, as links to /bin/busybox.
var busyboxPrograms = []string{"sh", "env", "id", "pwd", "cat", "echo", "ls", "grep", "touch", "true"}

// tarLayer is a layer made from entries given in memory.
func tarLayer(t testing.TB, add func(tw *tar.Writer)) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add(tw)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// busyboxImage builds a two-layer image from the host's static busybox (scripts/setup
// installs busybox-static): /bin with busybox and its applets, an /etc/passwd with root
// alone (so bothyd must add the sandbox's user), and, in the top layer, /app/hello.txt.
// pad adds a file of that many random-looking bytes to the top layer.
func busyboxImage(t testing.TB, cfg v1.Config, pad int) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("the image tests need a static busybox at /bin/busybox: run scripts/setup (busybox-static)")
	}
	base := tarLayer(t, func(tw *tar.Writer) {
		hdr := func(h *tar.Header, body []byte) {
			h.ModTime = time.Unix(0, 0)
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if body != nil {
				_, _ = tw.Write(body)
			}
		}
		hdr(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
		hdr(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))}, bb)
		for _, p := range busyboxPrograms {
			hdr(&tar.Header{Name: "bin/" + p, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
		}
		passwd := []byte("root:x:0:0:root:/root:/bin/sh\n")
		hdr(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
		hdr(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(passwd))}, passwd)
	})
	top := tarLayer(t, func(tw *tar.Writer) {
		hello := []byte("hello from the image\n")
		_ = tw.WriteHeader(&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)})
		_ = tw.WriteHeader(&tar.Header{Name: "app/hello.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(hello)), ModTime: time.Unix(0, 0)})
		_, _ = tw.Write(hello)
		if pad > 0 {
			// Incompressible, so that the figure measures bytes moved, not gzip's skill.
			data := make([]byte, pad)
			x := uint64(88172645463325252)
			for i := range data {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				data[i] = byte(x)
			}
			_ = tw.WriteHeader(&tar.Header{Name: "app/pad.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(pad), ModTime: time.Unix(0, 0)})
			_, _ = tw.Write(data)
		}
	})
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", hostArch()
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func hostArch() string { return goruntime.GOARCH }

// dockerSave is img as `docker save` writes it.
func dockerSave(t testing.TB, img v1.Image) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tarball.Write(name.MustParseReference("example.com/busybox:test"), img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ociLayoutTar is img as an OCI image layout, in a tar.
func ociLayoutTar(t testing.TB, img v1.Image) []byte {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err = filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func (d *daemon) importImage(name string, archive []byte) imageJSON {
	d.t.Helper()
	h := http.Header{"Content-Type": {"application/octet-stream"}}
	return decode[imageJSON](d.t, d.do("PUT", "/v1/images/"+name, bytes.NewReader(archive), h), 201)
}

// createOn makes a started sandbox on an image, deleted when the test ends.
func (d *daemon) createOn(id, image string) {
	d.t.Helper()
	decode[sandboxJSON](d.t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "image": image, "start": true}), 201)
	d.t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
	})
}

// serveRegistry serves an in-memory registry on loopback and pushes img to it as repo:tag;
// it returns the reference.
func serveRegistry(t testing.TB, img v1.Image, repo string) string {
	t.Helper()
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/" + repo
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

func (d *daemon) waitImage(name string) imageJSON {
	d.t.Helper()
	var img imageJSON
	waitFor(d.t, 2*time.Minute, "image "+name+" to be pulled", func() bool {
		img = decode[imageJSON](d.t, d.doJSON("GET", "/v1/images/"+name, nil), 200)
		return img.State != "pulling"
	})
	if img.State != "ready" {
		d.t.Fatalf("the pull of %s ended %s: %s", name, img.State, img.Error)
	}
	return img
}

// TestImages imports both tarball kinds and pulls from a loopback registry, runs commands in
// sandboxes on the images with the image configuration's defaults, keeps an image in use from
// deletion, and clones from a generation captured on an image.
func TestImages(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	img := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin", "GREETING=hi"}, WorkingDir: "/app"}, 0)
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	saved := d.importImage("bb-save", dockerSave(t, img))
	if saved.Kind != "oci" || saved.State != "ready" || len(saved.Layers) != 2 || saved.Config.WorkingDir != "/app" || saved.SizeBytes <= 0 {
		t.Fatalf("imported docker save archive: %+v", saved)
	}
	oci := d.importImage("bb-oci", ociLayoutTar(t, img))
	if oci.Digest != digest.String() {
		t.Errorf("OCI layout import digest %s, want %s", oci.Digest, digest)
	}

	rootImg := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/work", User: "root"}, 0)
	ref := serveRegistry(t, rootImg, "test/busybox:v1")
	pulling := decode[imageJSON](t, d.doJSON("POST", "/v1/images", map[string]any{"ref": ref, "name": "bb-pull"}), 202)
	if pulling.State != "pulling" && pulling.State != "ready" {
		t.Fatalf("pull answered %+v", pulling)
	}
	pulled := d.waitImage("bb-pull")
	if pulled.Config.User != "root" || len(pulled.Layers) != 2 {
		t.Fatalf("pulled image %+v", pulled)
	}

	list := decode[struct{ Items []imageJSON }](t, d.doJSON("GET", "/v1/images", nil), 200)
	names := map[string]string{}
	for _, i := range list.Items {
		names[i.Name] = i.Kind
	}
	if names["host"] != "host" || names["bb-save"] != "oci" || names["bb-oci"] != "oci" || names["bb-pull"] != "oci" {
		t.Errorf("image list %v", names)
	}
	info := decode[struct {
		Images []struct{ Name string } `json:"images"`
	}](t, d.doJSON("GET", "/v1/info", nil), 200)
	if len(info.Images) < 4 || info.Images[0].Name != "host" {
		t.Errorf("/v1/info images %+v", info.Images)
	}

	t.Run("defaults", func(t *testing.T) {
		d := d.in(t)
		for _, image := range []string{"bb-save", "bb-oci"} {
			id := "img-" + strings.TrimPrefix(image, "bb-")
			d.createOn(id, image)
			got := d.exec(id, map[string]any{"command": []string{"sh", "-c",
				"echo $GREETING; pwd; id -u; cat /etc/hostname; grep -c '^user:' /etc/passwd; ls -d /home/user; cat hello.txt; touch /home/user/w"}})
			want := "hi\n/app\n1000\n" + id + "\n1\n/home/user\nhello from the image\n"
			if got.ExitCode != 0 || got.Stdout != want {
				t.Errorf("%s: exec = %+v; want stdout %q", image, got, want)
			}
			got = d.exec(id, map[string]any{"command": []string{"sh", "-c", "echo $GREETING; pwd; id -u"},
				"env": []string{"GREETING=yo"}, "cwd": "/", "user": "root"})
			if got.Stdout != "yo\n/\n0\n" {
				t.Errorf("%s: exec with overrides = %+v", image, got)
			}
		}
		d.createOn("img-pull", "bb-pull")
		got := d.exec("img-pull", map[string]any{"command": []string{"sh", "-c", "pwd; id -u"}})
		if got.Stdout != "/work\n0\n" {
			t.Errorf("image User root and WorkingDir /work: exec = %+v", got)
		}
	})

	t.Run("in use", func(t *testing.T) {
		d := d.in(t)
		d.createOn("img-used", "bb-save")
		p := wantProblem(t, d.doJSON("DELETE", "/v1/images/bb-save", nil), 423, "image-in-use")
		if !strings.Contains(p.Detail, "sandbox img-used") {
			t.Errorf("image-in-use does not name the sandbox: %q", p.Detail)
		}
		wantProblem(t, d.doJSON("DELETE", "/v1/images/no-such-image", nil), 404, "image-not-found")
		wantProblem(t, d.doJSON("DELETE", "/v1/images/host", nil), 400, "invalid-request")
	})

	t.Run("template", func(t *testing.T) {
		d := d.in(t)
		d.createOn("img-src", "bb-oci")
		if got := d.exec("img-src", map[string]any{"command": []string{"sh", "-c", "echo captured > /app/state"}, "user": "root"}); got.ExitCode != 0 {
			t.Fatalf("write: %+v", got)
		}
		if r := d.doJSON("POST", "/v1/sandboxes/img-src/stop", nil); r.Status != 200 {
			t.Fatalf("stop: %d %s", r.Status, r.Body)
		}
		if r := d.doJSON("POST", "/v1/templates", map[string]any{"name": "on-image"}); r.Status != 201 {
			t.Fatalf("create template: %d %s", r.Status, r.Body)
		}
		g := decode[generationJSON](t, d.doJSON("POST", "/v1/templates/on-image/generations", map[string]any{"sandbox": "img-src"}), 201)
		if r := d.doJSON("DELETE", "/v1/sandboxes/img-src", nil); r.Status != 204 {
			t.Fatalf("delete the source: %d %s", r.Status, r.Body)
		}
		p := wantProblem(t, d.doJSON("DELETE", "/v1/images/bb-oci", nil), 423, "image-in-use")
		if !strings.Contains(p.Detail, "generation on-image/"+g.ID) {
			t.Errorf("image-in-use does not name the generation: %q", p.Detail)
		}
		clone := decode[cloneJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "img-clone", "start": true,
			"template": "on-image", "generation": g.ID}), 201)
		if clone.Template == nil || clone.Template.Generation != g.ID {
			t.Fatalf("clone %+v", clone)
		}
		got := d.exec("img-clone", map[string]any{"command": []string{"sh", "-c", "cat /app/state /app/hello.txt; cat /etc/hostname"}})
		if got.Stdout != "captured\nhello from the image\nimg-clone\n" {
			t.Errorf("clone exec = %+v", got)
		}
		if r := d.doJSON("POST", "/v1/sandboxes/img-clone/stop?force=true", nil); r.Status != 200 {
			t.Fatalf("stop the clone: %d %s", r.Status, r.Body)
		}
		if r := d.doJSON("DELETE", "/v1/sandboxes/img-clone", nil); r.Status != 204 {
			t.Fatalf("delete the clone: %d %s", r.Status, r.Body)
		}
		if r := d.doJSON("DELETE", "/v1/templates/on-image/generations/"+g.ID, nil); r.Status != 204 {
			t.Fatalf("retire: %d %s", r.Status, r.Body)
		}
		if r := d.doJSON("DELETE", "/v1/images/bb-oci", nil); r.Status != 204 {
			t.Fatalf("delete the image once nothing uses it: %d %s", r.Status, r.Body)
		}
		wantProblem(t, d.doJSON("GET", "/v1/images/bb-oci", nil), 404, "image-not-found")
	})
}

// stallingRegistry serves an in-memory registry on loopback whose blob downloads, while
// stall is set, send their first half and then hang until the client goes away: a pull in
// the middle of a layer, for a kill to interrupt.
func stallingRegistry(t testing.TB, stall *atomic.Bool) *httptest.Server {
	t.Helper()
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !stall.Load() || r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/sha256:") {
			inner.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		if rec.Code != http.StatusOK || len(body) < 1<<20 {
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(body)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestImagePullKilled kills bothyd with SIGKILL in the middle of a layer's pull, twice:
// `bothyd check` reports what the first kill left and `--repair` removes it; the next start
// cleans what the second left by itself; and the pull, retried, succeeds.
func TestImagePullKilled(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	var stall atomic.Bool
	stall.Store(true)
	srv := stallingRegistry(t, &stall)
	img := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}}, 8<<20)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/big:v1"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	stall.Store(false)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	stall.Store(true)

	d := startDaemon(t)
	pullUntilStalled := func() {
		t.Helper()
		decode[imageJSON](t, d.doJSON("POST", "/v1/images", map[string]any{"ref": ref, "name": "big"}), 202)
		waitFor(t, time.Minute, "the pull to be in the middle of a layer", func() bool {
			img := decode[imageJSON](t, d.doJSON("GET", "/v1/images/big", nil), 200)
			for _, l := range img.Layers {
				if l.BytesDone != nil && l.BytesTotal != nil && *l.BytesDone > 0 && *l.BytesDone < *l.BytesTotal {
					return true
				}
			}
			return false
		})
	}
	imageProblems := func(rep checkReport) []checkProblem {
		var out []checkProblem
		for _, p := range rep.Problems {
			if strings.HasPrefix(p.Entry, "images/") {
				out = append(out, p)
			}
		}
		return out
	}

	pullUntilStalled()
	d.Kill()
	rep, code, stderr := runCheck(t, d.Root)
	half := false
	for _, p := range imageProblems(rep) {
		half = half || p.Kind == "half-unpacked-layer"
	}
	if code != 1 || !half {
		t.Fatalf("check after a kill mid-pull: exit %d, problems %+v (%s); want a half-unpacked layer", code, rep.Problems, stderr)
	}
	if rep, code, stderr := runCheck(t, d.Root, "--repair"); code != 0 {
		t.Fatalf("check --repair: exit %d, %+v (%s)", code, rep.Problems, stderr)
	}

	d.start()
	pullUntilStalled()
	d.Kill()
	d.start()
	if rep, _, stderr := runCheck(t, d.Root); len(imageProblems(rep)) != 0 {
		t.Fatalf("the start after a kill mid-pull left %+v (%s)", imageProblems(rep), stderr)
	}

	stall.Store(false)
	decode[imageJSON](t, d.doJSON("POST", "/v1/images", map[string]any{"ref": ref, "name": "big"}), 202)
	d.waitImage("big")
	d.createOn("after-kill", "big")
	if got := d.exec("after-kill", map[string]any{"command": []string{"cat", "/app/hello.txt"}}); got.Stdout != "hello from the image\n" {
		t.Errorf("exec on the retried pull's image = %+v", got)
	}
}
