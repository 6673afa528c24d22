package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// fakeFetcher serves one image made of plain tar layers, counting fetches and opens. An
// open of a layer waits for gate when it is set, and a layer reader stops for good after
// stopAfter bytes when that is positive (telling the test on stopped).
type fakeFetcher struct {
	layers    [][]byte
	gate      chan struct{}
	opened    chan struct{}
	stopAfter int
	stopped   func()
	fetches   atomic.Int32
	opens     atomic.Int32
}

func sha(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }

func (f *fakeFetcher) config() []byte {
	var ids []string
	for _, l := range f.layers {
		ids = append(ids, sha(l))
	}
	cfg := map[string]any{
		"os": "linux", "architecture": "amd64",
		"config": map[string]any{"Env": []string{"A=1"}, "WorkingDir": "/w"},
		"rootfs": map[string]any{"type": "layers", "diff_ids": ids},
	}
	b, _ := json.Marshal(cfg)
	return b
}

func (f *fakeFetcher) Fetch(ctx context.Context, ref string) (*Source, error) {
	f.fetches.Add(1)
	cfg := f.config()
	src := &Source{ManifestDigest: sha([]byte("manifest of " + ref)), Config: cfg, ConfigDigest: sha(cfg)}
	for _, l := range f.layers {
		src.Layers = append(src.Layers, SourceLayer{Digest: sha(l), Size: int64(len(l)), Open: func(ctx context.Context) (io.ReadCloser, error) {
			f.opens.Add(1)
			if f.opened != nil {
				f.opened <- struct{}{}
			}
			if f.gate != nil {
				select {
				case <-f.gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			var r io.Reader = bytes.NewReader(l)
			if f.stopAfter > 0 {
				r = &stopReader{r: io.LimitReader(r, int64(f.stopAfter)), stopped: f.stopped}
			}
			return io.NopCloser(r), nil
		}})
	}
	return src, nil
}

// stopReader gives what r has and then, instead of EOF, tells stopped and blocks forever: a
// download that hangs mid-layer.
type stopReader struct {
	r       io.Reader
	stopped func()
}

func (s *stopReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err == io.EOF {
		s.stopped()
		select {}
	}
	return n, err
}

func manyFiles(t *testing.T, n int) []byte {
	ents := []ent{dir("data/")}
	for i := range n {
		ents = append(ents, file(fmt.Sprintf("data/f%05d", i), strings.Repeat("x", 512)))
	}
	return tarOf(t, ents...)
}

func TestPullSharesOneDownload(t *testing.T) {
	needRoot(t)
	t.Parallel()
	f := &fakeFetcher{layers: [][]byte{tarOf(t, file("a", "1"))}, gate: make(chan struct{}), opened: make(chan struct{}, 1)}
	s, _ := openStore(t, Options{Fetcher: f})
	ctx := ctxT(t)
	type result struct {
		img *Image
		err error
	}
	results := make(chan result, 2)
	var progress [2]atomic.Int32
	pull := func(i int) {
		img, err := s.Pull(ctx, "example.com/a:1", "a", func(LayerProgress) { progress[i].Add(1) })
		results <- result{img, err}
	}
	go pull(0)
	<-f.opened // the first pull is downloading its layer
	go pull(1)
	waitFor(t, "the second pull to join the first", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		fl := s.flights["example.com/a:1"]
		if fl == nil {
			return false
		}
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return fl.waiters == 2
	})
	close(f.gate)
	for range 2 {
		r := <-results
		if r.err != nil || r.img.Name != "a" {
			t.Fatalf("Pull = %+v, %v", r.img, r.err)
		}
	}
	if f.fetches.Load() != 1 || f.opens.Load() != 1 {
		t.Errorf("%d fetches, %d layer opens; want one of each for two pulls at once", f.fetches.Load(), f.opens.Load())
	}
	if progress[0].Load() == 0 || progress[1].Load() == 0 {
		t.Errorf("progress reports: %d and %d; want both pulls to see the shared download", progress[0].Load(), progress[1].Load())
	}
	// A later pull finds the layer present and opens nothing.
	if _, err := s.Pull(ctx, "example.com/a:1", "a2", nil); err != nil {
		t.Fatal(err)
	}
	if f.opens.Load() != 1 {
		t.Errorf("a pull of an image whose layers are present opened %d layers", f.opens.Load()-1)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestCrashMidUnpack kills a real process with SIGKILL while it unpacks a layer (its
// download hangs half way), then checks that the store holds nothing that looks whole, that
// Check reports the half-unpacked layer and Repair removes it, and that the pull retried
// succeeds.
func TestCrashMidUnpack(t *testing.T) {
	needRoot(t)
	t.Parallel()
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPullHangs$", "-test.v")
	cmd.Env = append(os.Environ(), "IMAGE_TEST_HELPER_ROOT="+root)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	stopped := false
	for sc.Scan() {
		if sc.Text() == "helper: download hangs" {
			stopped = true
			break
		}
	}
	if !stopped {
		t.Fatal("the helper ended before its download hung")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	s, err := Open(root, Options{Fetcher: &fakeFetcher{layers: [][]byte{manyFiles(t, 400)}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	names, _ := os.ReadDir(filepath.Join(s.Path(), LayersDir, Algorithm))
	for _, n := range names {
		if isHex64(n.Name()) {
			t.Errorf("a layer named %s looks whole after the crash", n.Name())
		}
	}
	ps, err := s.Check(ctxT(t), false)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].Kind != HalfUnpacked || ps[0].Repaired {
		t.Fatalf("Check = %v; want one half-unpacked layer, not repaired", ps)
	}
	ps, err = s.Check(ctxT(t), true)
	if err != nil || len(ps) != 1 || !ps[0].Repaired {
		t.Fatalf("Check(repair) = %v, %v; want the half-unpacked layer repaired", ps, err)
	}
	if ps, err := s.Check(ctxT(t), false); err != nil || len(ps) != 0 {
		t.Fatalf("Check after repair = %v, %v; want a clean store", ps, err)
	}
	img, err := s.Pull(ctxT(t), "example.com/big:1", "big", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readLayerFile(t, s, img.Layers[0], "data/f00399"); got != strings.Repeat("x", 512) {
		t.Errorf("the retried pull's last file = %q", got)
	}
}

// TestHelperPullHangs is the process TestCrashMidUnpack kills: it pulls an image whose
// download hangs half way through its layer and says so on stdout.
func TestHelperPullHangs(t *testing.T) {
	root := os.Getenv("IMAGE_TEST_HELPER_ROOT")
	if root == "" {
		t.Skip("a helper process of TestCrashMidUnpack")
	}
	layer := manyFiles(t, 400)
	var once sync.Once
	f := &fakeFetcher{layers: [][]byte{layer}, stopAfter: len(layer) / 2, stopped: func() {
		once.Do(func() { fmt.Println("helper: download hangs") })
	}}
	s, err := Open(root, Options{Fetcher: f})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Pull(ctxT(t), "example.com/big:1", "big", nil)
	t.Fatalf("the pull returned (%v) instead of hanging", err)
}

func TestCheckRepairsUnreferencedLayers(t *testing.T) {
	needRoot(t)
	t.Parallel()
	f := &fakeFetcher{layers: [][]byte{tarOf(t, file("a", "1")), tarOf(t, file("b", "2"))}}
	s, _ := openStore(t, Options{Fetcher: f})
	ctx := ctxT(t)
	img, err := s.Pull(ctx, "example.com/a:1", "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ps, err := s.Check(ctx, false); err != nil || len(ps) != 0 {
		t.Fatalf("Check of a consistent store = %v, %v", ps, err)
	}
	// A live import holds a work lock: a deletion leaves the layers (the import may be
	// about to record an image on them), and Repair reports them but keeps them, since a
	// live import's fresh layers are unreferenced too.
	w, err := s.lockWork(ctx, importKey(), true)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	ps, err := s.Check(ctx, true)
	if err != nil || len(ps) != 2 || ps[0].Kind != UnreferencedLayer || ps[0].Repaired {
		t.Fatalf("Check(repair) while an import runs = %v, %v; want 2 unreferenced layers, kept", ps, err)
	}
	if err := w.release(); err != nil {
		t.Fatal(err)
	}
	ps, err = s.Check(ctx, true)
	if err != nil || len(ps) != 2 || !ps[0].Repaired || !ps[1].Repaired {
		t.Fatalf("Check(repair) = %v, %v; want 2 unreferenced layers removed", ps, err)
	}
	for _, d := range img.Layers {
		dir, _ := s.LayerDir(d)
		if _, err := os.Lstat(filepath.Dir(dir)); !os.IsNotExist(err) {
			t.Errorf("layer %s is still there: %v", d, err)
		}
	}
}

// TestPullBoundsLayers: an image of more layers than MaxLayers is refused before any layer
// is read, whatever its fetcher (a registry's manifest, an archive's) declares.
func TestPullBoundsLayers(t *testing.T) {
	t.Parallel()
	layers := make([][]byte, MaxLayers+1)
	for i := range layers {
		layers[i] = []byte(fmt.Sprintf("layer %d", i))
	}
	f := &fakeFetcher{layers: layers}
	s, _ := openStore(t, Options{Fetcher: f})
	_, err := s.Pull(ctxT(t), "example.com/many:1", "many", nil)
	if !errors.Is(err, ErrTooLarge) || errcode.Of(err) != errcode.PayloadTooLarge || !strings.Contains(err.Error(), "129 layers") {
		t.Fatalf("Pull of %d layers = %v; want payload-too-large: 129 layers", len(layers), err)
	}
	if n := f.opens.Load(); n != 0 {
		t.Errorf("the refused pull opened %d layers; want none", n)
	}
}

// TestDeleteRemovesLayers: deleting an image removes the layers no other image names, at
// once, so that a check right after finds nothing (issue 37: check reported them as
// unreferenced until the server's next start); a layer another image shares stays.
func TestDeleteRemovesLayers(t *testing.T) {
	needRoot(t)
	t.Parallel()
	shared, own := tarOf(t, file("shared", "1")), tarOf(t, file("own", "2"))
	s, _ := openStore(t, Options{Fetcher: &fakeFetcher{layers: [][]byte{shared, own}}})
	ctx := ctxT(t)
	a, err := s.Pull(ctx, "example.com/a:1", "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.opts.Fetcher = &fakeFetcher{layers: [][]byte{shared}}
	if _, err := s.Pull(ctx, "example.com/b:1", "b", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ps, err := s.Check(ctx, false); err != nil || len(ps) != 0 {
		t.Fatalf("Check right after a deletion = %v, %v; want nothing", ps, err)
	}
	for i, want := range []bool{true, false} {
		dir, _ := s.LayerDir(a.Layers[i])
		_, err := os.Lstat(filepath.Dir(dir))
		if got := err == nil; got != want {
			t.Errorf("layer %d (%s) present = %v (%v); want %v", i, a.Layers[i], got, err, want)
		}
	}
	names, err := platform.ReadDirNames(s.layers)
	if err != nil || len(names) != 1 {
		t.Errorf("layers/sha256 holds %v (%v); want the shared layer alone", names, err)
	}
	if got := readLayerFile(t, s, a.Layers[0], "shared"); got != "1" {
		t.Errorf("the shared layer's file = %q", got)
	}
}
