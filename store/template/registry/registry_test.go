//go:build linux

package registry

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/store/template"
)

// testRegistry is go-containerregistry's in-memory registry on loopback, counting the blob
// requests it answers by method; tamper, if set, may rewrite a blob GET's body.
type testRegistry struct {
	srv      *httptest.Server
	blobGets atomic.Int64
	uploads  atomic.Int64
	tamper   func(body []byte) []byte
	// refuseDelete answers every DELETE 405, as a registry with deletion off does.
	refuseDelete atomic.Bool
}

func newTestRegistry(t testing.TB) *testRegistry {
	t.Helper()
	tr := &testRegistry{}
	inner := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	tr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && tr.refuseDelete.Load() {
			http.Error(w, `{"errors":[{"code":"UNSUPPORTED","message":"deletion is off"}]}`, http.StatusMethodNotAllowed)
			return
		}
		isBlob := strings.Contains(r.URL.Path, "/blobs/")
		if isBlob && r.Method == http.MethodGet {
			tr.blobGets.Add(1)
			if tr.tamper != nil {
				rec := httptest.NewRecorder()
				inner.ServeHTTP(rec, r)
				body := tr.tamper(rec.Body.Bytes())
				w.WriteHeader(rec.Code)
				_, _ = w.Write(body)
				return
			}
		}
		if strings.Contains(r.URL.Path, "/blobs/uploads/") && r.Method == http.MethodPost {
			tr.uploads.Add(1)
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(tr.srv.Close)
	return tr
}

func (tr *testRegistry) repo() string {
	return strings.TrimPrefix(tr.srv.URL, "http://") + "/bothy/templates"
}

func openStore(t *testing.T) *template.Store {
	t.Helper()
	ts, err := template.Open(t.TempDir(), template.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ts.Close() })
	return ts
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// captured makes template "base" with one generation captured from a small tree holding a
// file, a hard link, a symbolic link, a whiteout and an opaque directory.
func captured(t *testing.T, ts *template.Store) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a generation keeps ownership, whiteouts and trusted xattrs")
	}
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "etc", "opaque"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "etc", "hello"), []byte("hello from A\n"), 0o644))
	must(t, os.Link(filepath.Join(src, "etc", "hello"), filepath.Join(src, "etc", "hello2")))
	must(t, os.Symlink("/etc/hello", filepath.Join(src, "link")))
	big := make([]byte, 2*BlobThreshold)
	for i := range big {
		big[i] = byte(i * 7)
	}
	must(t, os.WriteFile(filepath.Join(src, "big"), big, 0o600)) // a blob of its own
	must(t, os.Chown(filepath.Join(src, "etc", "hello"), 1000, 1000))
	must(t, syscallMknodWhiteout(filepath.Join(src, "etc", "gone")))
	must(t, setxattr(filepath.Join(src, "etc", "opaque"), "trusted.overlay.opaque", "y"))
	if _, err := ts.CreateTemplate(ctx(t), "base"); err != nil {
		t.Fatal(err)
	}
	g, err := ts.Capture(ctx(t), "base", src, template.Key{Runtime: "namespace/test", Image: "host"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g.ID
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestPushPullRoundTrip(t *testing.T) {
	reg := newTestRegistry(t)
	a, b := openStore(t), openStore(t)
	gen := captured(t, a)
	ra, err := New(Options{Repository: reg.repo()}, a)
	must(t, err)
	rb, err := New(Options{Repository: reg.repo()}, b)
	must(t, err)

	d1, err := ra.Push(ctx(t), "base", gen)
	must(t, err)
	uploads := reg.uploads.Load()
	if uploads != 4 {
		t.Fatalf("the first push started %d blob uploads, want 4 (configuration, archive, the large file, this node's mark)", uploads)
	}
	d2, err := ra.Push(ctx(t), "base", gen)
	must(t, err)
	if d1 != d2 || reg.uploads.Load() != uploads {
		t.Fatalf("a second push of the same generation: digest %s then %s, uploads %d then %d", d1, d2, uploads, reg.uploads.Load())
	}

	must(t, rb.Pull(ctx(t), "base", gen))
	now, _ := b.Now()
	g, err := b.Generation("base", gen, now)
	must(t, err)
	if g.State != template.StateActive || g.Key.Runtime != "namespace/test" || g.Eligibility != template.Eligible {
		t.Fatalf("pulled generation: %+v", g)
	}
	pa, _ := a.PayloadDir("base", gen)
	pb, _ := b.PayloadDir("base", gen)
	if sa, sb := treeOf(t, pa), treeOf(t, pb); sa != sb {
		t.Fatalf("the pulled payload differs from the pushed one:\n%s\n---\n%s", sa, sb)
	}
	// A pull of a generation the store holds is refused before it downloads anything.
	gets := reg.blobGets.Load()
	if err := rb.Pull(ctx(t), "base", gen); errcode.Of(err) != errcode.TemplateExists {
		t.Fatalf("pulling a held generation again: %v", err)
	}
	if reg.blobGets.Load() != gets+1 { // the configuration only
		t.Fatalf("pulling a held generation read %d blobs", reg.blobGets.Load()-gets)
	}
	// A generation that keeps the large file (as a clone's capture keeps its generation's
	// files) uploads only what is new: its configuration and archive (and this node's mark).
	src2 := t.TempDir()
	must(t, os.Link(filepath.Join(pa, "big"), filepath.Join(src2, "big")))
	must(t, os.WriteFile(filepath.Join(src2, "new"), []byte("new in g2\n"), 0o644))
	src2dir, err := os.Open(src2)
	must(t, err)
	defer src2dir.Close()
	lineage := &template.Source{Sandbox: "clone-1", Template: "base", Generation: gen}
	g2, err := a.CaptureLayersWith(ctx(t), "base", []*os.File{src2dir}, template.Key{Runtime: "namespace/test", Image: "host"}, template.CaptureHooks{Source: lineage})
	must(t, err)
	uploads = reg.uploads.Load()
	_, err = ra.Push(ctx(t), "base", g2.ID)
	must(t, err)
	if got := reg.uploads.Load() - uploads; got != 3 {
		t.Fatalf("the push of a generation sharing the large file started %d uploads, want 3", got)
	}
	must(t, rb.Pull(ctx(t), "base", g2.ID))
	pa2, _ := a.PayloadDir("base", g2.ID)
	pb2, _ := b.PayloadDir("base", g2.ID)
	if sa, sb := treeOf(t, pa2), treeOf(t, pb2); sa != sb {
		t.Fatalf("the second pulled payload differs from the pushed one:\n%s\n---\n%s", sa, sb)
	}
	// The pulled generation keeps its lineage.
	if pulled, err := b.Generation("base", g2.ID, now); err != nil || pulled.Source == nil || *pulled.Source != *lineage {
		t.Fatalf("the pulled generation's source: %+v, %v; want %+v", pulled, err, lineage)
	}
	// The pulled generation takes leases and is checked clean.
	tx, err := b.Lock(ctx(t))
	must(t, err)
	_, err = tx.Leasable("base", gen, now)
	tx.Unlock()
	must(t, err)
	probs, err := b.Check(ctx(t), func(string, string) bool { return false }, false)
	must(t, err)
	if len(probs) != 0 {
		t.Fatalf("check of the pulling store: %v", probs)
	}
}

// treeOf describes a tree: names, types, modes, owners, sizes, contents, link targets and
// xattrs that a generation keeps.
func treeOf(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := statOf(fi)
		b.WriteString(rel + " " + fi.Mode().String() + " " + st)
		switch {
		case fi.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			b.WriteString(" " + string(data))
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			b.WriteString(" -> " + target)
		}
		if v, ok := getxattr(p, "trusted.overlay.opaque"); ok {
			b.WriteString(" opaque=" + v)
		}
		b.WriteString("\n")
		return nil
	})
	must(t, err)
	return b.String()
}

func TestHostileRegistry(t *testing.T) {
	// hostileManifest pushes, by hand, a generation whose archive is payload, as a hostile
	// registry could serve it.
	push := func(t *testing.T, reg *testRegistry, payload []byte, declared int64, files ...[]byte) {
		t.Helper()
		r, err := New(Options{Repository: reg.repo()}, openStore(t))
		must(t, err)
		cfg, _ := json.Marshal(genConfig{Format: configFormat, Template: "base", Generation: "g000001", Key: template.Key{Runtime: "namespace/test"}})
		for _, blob := range append([][]byte{cfg, payload}, files...) {
			must(t, remote.WriteLayer(r.repo, &blobLayer{data: blob, mt: ConfigMediaType}, r.opts...))
		}
		if declared == 0 {
			declared = int64(len(payload))
		}
		m := manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: ArtifactType,
			Config:      v1.Descriptor{MediaType: ConfigMediaType, Size: int64(len(cfg)), Digest: digestOf(cfg)},
			Layers:      []v1.Descriptor{{MediaType: types.MediaType(LayerMediaType), Size: declared, Digest: digestOf(payload)}},
			Annotations: map[string]string{AnnotationTemplate: "base", AnnotationGeneration: "g000001"}}
		for _, f := range files {
			m.Layers = append(m.Layers, v1.Descriptor{MediaType: FileMediaType, Size: int64(len(f)), Digest: digestOf(f)})
		}
		raw, _ := json.Marshal(m)
		must(t, remote.Put(r.repo.Tag(Tag("base", "g000001")), rawManifest(raw), r.opts...))
	}
	tarOf := func(entries ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			must(t, tw.WriteHeader(h))
			if h.Size > 0 {
				_, _ = tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		must(t, tw.Close())
		return buf.Bytes()
	}
	good := tarOf(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10})
	fileData := bytes.Repeat([]byte("large file "), 1000)
	namesBlob := func(d v1.Hash, size int) []byte {
		return tarOf(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX,
			PAXRecords: map[string]string{paxBlob: d.String(), paxBlobSize: strconv.Itoa(size)}})
	}
	cases := []struct {
		name     string
		payload  []byte
		files    [][]byte
		declared int64
		tamper   func([]byte) []byte
		limits   Limits
		want     string
	}{
		{name: "dotdot", payload: tarOf(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}), want: "not a clean path"},
		{name: "dotdot inside", payload: tarOf(&tar.Header{Name: "a/../../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}), want: "not a clean path"},
		{name: "absolute", payload: tarOf(&tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}), want: "not a clean path"},
		{name: "through a link", payload: tarOf(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, &tar.Header{Name: "l/escape", Typeflag: tar.TypeReg, Size: 3}), want: "not a directory unpacked before it"},
		{name: "hard link out", payload: tarOf(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"}), want: "not a regular file unpacked before it"},
		{name: "device", payload: tarOf(&tar.Header{Name: "sda", Typeflag: tar.TypeChar, Devmajor: 8}), want: "only whiteouts"},
		{name: "wrong digest", payload: good, tamper: func(b []byte) []byte {
			if bytes.Equal(b, good) {
				c := bytes.Clone(b)
				c[600] ^= 1 // a byte of the file's contents
				return c
			}
			return b
		}, want: "digest"},
		{name: "longer than declared", payload: good, tamper: func(b []byte) []byte {
			if bytes.Equal(b, good) {
				return append(bytes.Clone(b), make([]byte, 4096)...)
			}
			return b
		}, want: "longer than"},
		{name: "blob not listed", payload: namesBlob(digestOf(fileData), len(fileData)), want: "does not list"},
		{name: "blob of another size", payload: namesBlob(digestOf(fileData), 5), files: [][]byte{fileData}, want: "does not list"},
		{name: "file blob with a wrong digest", payload: namesBlob(digestOf(fileData), len(fileData)), files: [][]byte{fileData}, tamper: func(b []byte) []byte {
			if bytes.Equal(b, fileData) {
				c := bytes.Clone(b)
				c[100] ^= 1
				return c
			}
			return b
		}, want: "digest"},
		{name: "file blob longer than declared", payload: namesBlob(digestOf(fileData), len(fileData)), files: [][]byte{fileData}, tamper: func(b []byte) []byte {
			if bytes.Equal(b, fileData) {
				return append(bytes.Clone(b), 'x')
			}
			return b
		}, want: "longer than"},
		{name: "declared over the bound", payload: good, limits: Limits{MaxBytes: 1024}, want: "at most 1024"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if os.Geteuid() != 0 {
				t.Skip("needs root: an archive's owners are set")
			}
			reg := newTestRegistry(t)
			push(t, reg, tc.payload, tc.declared, tc.files...)
			reg.tamper = tc.tamper
			ts := openStore(t)
			r, err := New(Options{Repository: reg.repo(), Limits: tc.limits}, ts)
			must(t, err)
			err = r.Pull(ctx(t), "base", "g000001")
			if errcode.Of(err) != errcode.RegistryRefused || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("pull: %v (%s), want registry-refused saying %q", err, errcode.Of(err), tc.want)
			}
			now, _ := ts.Now()
			if gens, err := ts.Generations("base", now); err == nil && len(gens) != 0 {
				t.Fatalf("a refused pull left generations %v", gens)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(ts.Path()), "escape")); err == nil {
				t.Fatal("the archive wrote outside the generation")
			}
			entries, _ := os.ReadDir(filepath.Join(ts.Path(), "base"))
			for _, e := range entries {
				if e.Name() != "template.json" {
					t.Fatalf("a refused pull left %s in the template's directory", e.Name())
				}
			}
		})
	}
}

func TestPullRegistryDown(t *testing.T) {
	reg := newTestRegistry(t)
	reg.srv.Close()
	r, err := New(Options{Repository: reg.repo()}, openStore(t))
	must(t, err)
	if err := r.Pull(ctx(t), "base", "g000001"); errcode.Of(err) != errcode.RegistryUnavailable {
		t.Fatalf("pull from a stopped registry: %v (%s), want registry-unavailable", err, errcode.Of(err))
	}
}

// TestTombstones: a quarantine's tombstone, then a retirement's, which a later quarantine
// does not replace; a pull of a tombstoned generation is refused before any blob is read.
func TestTombstones(t *testing.T) {
	reg := newTestRegistry(t)
	r, err := New(Options{Repository: reg.repo()}, openStore(t))
	must(t, err)
	steps := []struct {
		retire            bool
		wantFound, wantRe bool
	}{{false, true, false}, {true, true, true}, {false, true, true}}
	if found, _, err := r.Tombstoned(ctx(t), "base", "g000001"); err != nil || found {
		t.Fatalf("a tombstone before any: %v %v", found, err)
	}
	for _, s := range steps {
		must(t, r.Tombstone(ctx(t), "base", "g000001", s.retire))
		found, retire, err := r.Tombstoned(ctx(t), "base", "g000001")
		if err != nil || found != s.wantFound || retire != s.wantRe {
			t.Fatalf("after Tombstone(retire=%v): found %v, retire %v, %v", s.retire, found, retire, err)
		}
	}
	gets := reg.blobGets.Load()
	if err := r.Pull(ctx(t), "base", "g000001"); errcode.Of(err) != errcode.TemplateTombstoned {
		t.Fatalf("pull of a retired generation: %v", err)
	}
	if reg.blobGets.Load() != gets {
		t.Fatal("the refused pull read a blob")
	}
}

// TestFlushTombstones: the outbox's records reach the registry only for changes made here.
// A tombstone recorded while the registry is down stays in the outbox; once the registry
// is back a flush pushes it and empties the outbox. A record whose generation is still
// active here is left alone while its change is under way, and dropped without a push once
// it is not (the change was never made).
func TestFlushTombstones(t *testing.T) {
	reg := newTestRegistry(t)
	ts := openStore(t)
	gen := captured(t, ts)
	_, err := ts.Capture(ctx(t), "base", t.TempDir(), template.Key{Runtime: "namespace/test", Image: "host"}, nil)
	must(t, err)
	gens, err := ts.Generations("base", mustNow(t, ts))
	must(t, err)
	other := gens[0].ID
	if other == gen {
		other = gens[1].ID
	}

	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	offline, err := New(Options{Repository: strings.TrimPrefix(down.URL, "http://") + "/bothy/templates"}, ts)
	must(t, err)
	must(t, ts.RecordRemoteTombstone(ctx(t), "base", gen, true))
	retireHere(t, ts, "base", gen)
	must(t, ts.RecordRemoteTombstone(ctx(t), "base", other, false)) // being made
	busy := func(tmpl, gen string) bool { return gen == other }
	if _, err := offline.FlushTombstones(ctx(t), busy); errcode.Of(err) != errcode.RegistryUnavailable {
		t.Fatalf("flush to a stopped registry: %v, want registry-unavailable", err)
	}
	if recs, _ := ts.RemoteTombstones(); len(recs) != 2 {
		t.Fatalf("outbox after a flush with a change under way: %+v, want both records", recs)
	}
	// The change under way is over and was not made (refused, or a crash before it).
	if _, err := offline.FlushTombstones(ctx(t), nil); errcode.Of(err) != errcode.RegistryUnavailable {
		t.Fatalf("flush to a stopped registry: %v, want registry-unavailable", err)
	}
	if recs, _ := ts.RemoteTombstones(); len(recs) != 1 || recs[0].Generation != gen {
		t.Fatalf("outbox after a flush to a stopped registry: %+v, want the retirement alone", recs)
	}

	r, err := New(Options{Repository: reg.repo()}, ts)
	must(t, err)
	pushed, err := r.FlushTombstones(ctx(t), nil)
	must(t, err)
	if len(pushed) != 1 || pushed[0].Generation != gen || !pushed[0].Retire {
		t.Fatalf("pushed %+v, want the retirement of %s", pushed, gen)
	}
	if found, retire, err := r.Tombstoned(ctx(t), "base", gen); err != nil || !found || !retire {
		t.Fatalf("the registry's tombstone of %s: %v %v %v", gen, found, retire, err)
	}
	if found, _, err := r.Tombstoned(ctx(t), "base", other); err != nil || found {
		t.Fatalf("a tombstone of %s, never made: %v %v", other, found, err)
	}
	if recs, _ := ts.RemoteTombstones(); len(recs) != 0 {
		t.Fatalf("outbox after the flush: %+v", recs)
	}
}

func mustNow(t *testing.T, ts *template.Store) template.TimeContract {
	t.Helper()
	now, err := ts.Now()
	must(t, err)
	return now
}
