package image

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func twoLayers(t *testing.T, opts ...tarball.LayerOption) (base, top v1.Layer) {
	base = gcrLayer(t, tarOf(t, dir("etc/"), file("etc/os-release", "ID=test\n"), file("etc/motd", "old\n")), opts...)
	top = gcrLayer(t, tarOf(t, dir("work/"), file("work/hello.txt", "hello\n"), file("etc/.wh.motd", "")), opts...)
	return base, top
}

func checkImported(t *testing.T, s *Store, img *Image, want v1.Image) {
	t.Helper()
	digest, _ := want.Digest()
	cf, _ := want.ConfigFile()
	if img.Config.WorkingDir != "/work" || img.Config.User != "1000:1000" || !slices.Equal(img.Config.Env, cf.Config.Env) ||
		!slices.Equal(img.Config.Cmd, []string{"echo hi"}) || !slices.Equal(img.Config.Entrypoint, []string{"/bin/sh", "-c"}) {
		t.Errorf("config = %+v; want the image's Env, WorkingDir, User, Entrypoint, Cmd", img.Config)
	}
	if len(img.Layers) != 2 {
		t.Fatalf("layers = %v; want 2", img.Layers)
	}
	for i, d := range cf.RootFS.DiffIDs {
		if img.Layers[i] != d.String() {
			t.Errorf("layer %d = %s; want %s (bottom to top)", i, img.Layers[i], d)
		}
	}
	if got := readLayerFile(t, s, img.Layers[0], "etc/os-release"); got != "ID=test\n" {
		t.Errorf("etc/os-release = %q", got)
	}
	if got := readLayerFile(t, s, img.Layers[1], "work/hello.txt"); got != "hello\n" {
		t.Errorf("work/hello.txt = %q", got)
	}
	got, err := s.Get(img.Name)
	if err != nil || got.ManifestDigest != img.ManifestDigest {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	_ = digest
	dirs, err := s.LayerDirs(img.Name)
	if err != nil || len(dirs) != 2 || filepath.Base(filepath.Dir(dirs[0])) != img.Layers[1][len("sha256:"):] {
		t.Errorf("LayerDirs = %v, %v; want the top layer first", dirs, err)
	}
}

func TestImportDockerSave(t *testing.T) {
	needRoot(t)
	t.Parallel()
	s, _ := openStore(t, Options{})
	want := hostImage(t, func() []v1.Layer { a, b := twoLayers(t); return []v1.Layer{a, b} }()...)
	var buf bytes.Buffer
	if err := tarball.Write(name.MustParseReference("example.com/test:v1"), want, &buf); err != nil {
		t.Fatal(err)
	}
	var reports []LayerProgress
	img, err := s.Import(ctxT(t), "saved", &buf, func(p LayerProgress) { reports = append(reports, p) })
	if err != nil {
		t.Fatal(err)
	}
	checkImported(t, s, img, want)
	if len(reports) == 0 || reports[len(reports)-1].Done != reports[len(reports)-1].Total {
		t.Errorf("progress = %+v; want reports ending with a layer done", reports)
	}
	if names, _ := os.ReadDir(filepath.Join(s.Path(), StagingDir)); len(names) != 0 {
		t.Errorf("staging holds %v after the import", names)
	}
}

func TestImportOCILayoutZstd(t *testing.T) {
	needRoot(t)
	t.Parallel()
	s, _ := openStore(t, Options{})
	base, top := twoLayers(t, tarball.WithCompression(compression.ZStd))
	want := hostImage(t, base, top)
	// An index with the image for this host and another for a platform it is not.
	other := testImage(t, "s390x", gcrLayer(t, tarOf(t, file("wrong", "platform"))))
	if runtimeIsS390x() {
		other = testImage(t, "amd64", gcrLayer(t, tarOf(t, file("wrong", "platform"))))
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "other"}}},
		mutate.IndexAddendum{Add: want, Descriptor: v1.Descriptor{Platform: platformOf(t, want)}},
	)
	img, err := s.Import(ctxT(t), "layout", bytes.NewReader(ociLayoutTar(t, idx)), nil)
	if err != nil {
		t.Fatal(err)
	}
	checkImported(t, s, img, want)
	if d, _ := want.Digest(); img.ManifestDigest != d.String() {
		t.Errorf("manifest digest = %s; want %s", img.ManifestDigest, d)
	}
	// A second image sharing the base shares its layer on disk.
	second := hostImage(t, base, gcrLayer(t, tarOf(t, file("second", "2"))))
	img2, err := s.Import(ctxT(t), "second", bytes.NewReader(ociLayoutTar(t, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: second}))), nil)
	if err != nil {
		t.Fatal(err)
	}
	if img2.Layers[0] != img.Layers[0] {
		t.Errorf("the shared base has two diff ids: %s, %s", img2.Layers[0], img.Layers[0])
	}
	layers, _ := os.ReadDir(filepath.Join(s.Path(), LayersDir, Algorithm))
	if len(layers) != 3 {
		t.Errorf("the store holds %d layers; want 3 (one shared base, two tops)", len(layers))
	}
}

func platformOf(t *testing.T, img v1.Image) *v1.Platform {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return &v1.Platform{OS: cf.OS, Architecture: cf.Architecture}
}

func runtimeIsS390x() bool { return HostPlatform() == "linux/s390x" }

func TestImportRefusesTamperedArchives(t *testing.T) {
	needRoot(t)
	t.Parallel()
	base, top := twoLayers(t)
	good := hostImage(t, base, top)
	layoutTar := ociLayoutTar(t, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: good}))
	topDigest, _ := top.Digest()

	// A blob whose bytes are not its name's digest: flip one byte of the top layer's blob.
	tampered := tamperMember(t, layoutTar, "blobs/sha256/"+topDigest.Hex)

	// A docker save archive whose configuration lies about a diff id.
	lying := hostImage(t, base, top)
	cf, _ := lying.ConfigFile()
	cf = cf.DeepCopy()
	// Not another layer's diff id: a diff id the store holds is reused without reading the
	// archive's bytes for it, which is what content addressing means.
	cf.RootFS.DiffIDs[1] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	lyingCfg, err := mutate.ConfigFile(lying, cf)
	if err != nil {
		t.Fatal(err)
	}
	var saved bytes.Buffer
	if err := tarball.Write(name.MustParseReference("example.com/lie:v1"), lyingCfg, &saved); err != nil {
		t.Fatal(err)
	}

	// An image of no layers: nothing a sandbox could run.
	layerless := ociLayoutTar(t, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: hostImage(t)}))

	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"blob not matching its digest", tampered, ErrDigestMismatch},
		{"no layers", layerless, ErrBadArchive},
		{"layer not matching its diff id", saved.Bytes(), ErrDigestMismatch},
		{"not an archive", []byte("hello, I am not a tar archive at all, really, not at all......"), ErrBadArchive},
		{"hostile member name", tarOf(t, file("../../etc/x", "x")), ErrBadArchive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := openStore(t, Options{})
			if _, err := s.Import(ctxT(t), "bad", bytes.NewReader(tc.data), nil); !errors.Is(err, tc.want) {
				t.Fatalf("Import = %v; want %v", err, tc.want)
			}
			if _, err := s.Get("bad"); err == nil {
				t.Error("a refused import left an image record")
			}
			ps, err := s.Check(ctxT(t), false)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				if p.Kind != UnreferencedLayer {
					t.Errorf("after a refused import: %v", p)
				}
			}
		})
	}
}

func TestImportBoundsArchive(t *testing.T) {
	needRoot(t)
	t.Parallel()
	s, _ := openStore(t, Options{MaxArchiveBytes: 4096})
	data := tarOf(t, file("oci-layout", string(make([]byte, 8192))))
	if _, err := s.Import(ctxT(t), "big", bytes.NewReader(data), nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Import of an archive over MaxArchiveBytes = %v; want ErrTooLarge", err)
	}
}
