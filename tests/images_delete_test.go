package tests

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestImageDeleteCheck deletes images while bothyd runs and runs `bothyd check` right after
// (issue 37: check reported a deleted image's layers as unreferenced, FAILED, until the
// server's next start). A deletion removes the layers at once; one made while a pull runs
// leaves them (the pull may be about to use them), and check notes them without failing.
func TestImageDeleteCheck(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	layersDir := filepath.Join(d.Root, "images", ".oci", "layers", "sha256")
	layers := func() []string {
		t.Helper()
		names, err := os.ReadDir(layersDir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range names {
			out = append(out, n.Name())
		}
		return out
	}
	unreferenced := func(r checkReport) int {
		n := 0
		for _, p := range r.Notes {
			if p.Kind == "unreferenced-layer" {
				n++
			}
		}
		return n
	}

	img := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}}, 0)
	d.importImage("del-a", dockerSave(t, img))
	if got := layers(); len(got) != 2 {
		t.Fatalf("after the import the store holds layers %v; want 2", got)
	}
	d.mustStatus(204, "DELETE", "/v1/images/del-a", nil)
	if r := mustCheckClean(t, d.Root, "right after a deletion"); unreferenced(r) != 0 {
		t.Errorf("check right after a deletion notes %+v; want no unreferenced layer", r.Notes)
	}
	if got := layers(); len(got) != 0 {
		t.Errorf("after the deletion the store holds %v; want no layer", got)
	}

	// While a pull is in the middle of a layer, a deletion leaves the layers it would
	// remove: check notes them and passes.
	var stall atomic.Bool
	srv := stallingRegistry(t, &stall)
	big := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/big"}, 4<<20)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/big:v1"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, big); err != nil {
		t.Fatal(err)
	}
	stall.Store(true)
	d.importImage("del-b", dockerSave(t, img))
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
	d.mustStatus(204, "DELETE", "/v1/images/del-b", nil)
	if r := mustCheckClean(t, d.Root, "a deletion during a pull"); unreferenced(r) == 0 {
		t.Errorf("check during a pull notes %+v; want the deleted image's layers noted as unreferenced", r.Notes)
	}
	// The stalled download ends with the server (a graceful stop would wait for it).
	d.Kill()
}

// TestImageDeleteOfADirectoryImage: a root file system directory an operator put under the
// state root's images/ is an image sandboxes can use, but not the image store's to delete:
// the deletion is refused with foreign-files (409, not the invalid-request of a request the
// contract refuses) and the directory is kept.
func TestImageDeleteOfADirectoryImage(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	dir := filepath.Join(d.Root, "images", "handmade")
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := wantProblem(t, d.do("DELETE", "/v1/images/handmade", nil, nil), 409, "foreign-files")
	if !strings.Contains(p.Detail, "by hand") {
		t.Errorf("the refusal's detail %q does not say what to do", p.Detail)
	}
	if _, err := os.Stat(filepath.Join(dir, "etc")); err != nil {
		t.Errorf("the refused deletion touched the directory: %v", err)
	}
}
