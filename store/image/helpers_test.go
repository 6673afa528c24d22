package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// needRoot skips a test that unpacks layers: unpacking sets owners and makes whiteouts
// (device nodes), which only root may. CI runs as root.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("unpacking layers needs root (chown, mknod, trusted xattrs); run the tests as root")
	}
}

// ent is one tar entry of a test layer.
type ent struct {
	hdr  tar.Header
	body string
}

func file(name, body string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}, body: body}
}

func dir(name string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}

func symlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func hardlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

func tarOf(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		h.Format = tar.FormatPAX
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %s: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func openStore(t *testing.T, opts Options) (*Store, string) {
	t.Helper()
	root := t.TempDir()
	s, err := Open(root, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, root
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// gcrLayer makes a layer of the library from a tar.
func gcrLayer(t *testing.T, data []byte, opts ...tarball.LayerOption) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage builds an image for the host's platform from layer tars, with a configuration
// that the store must keep.
func testImage(t *testing.T, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/usr/bin:/bin", "GREETING=hello"}
	cf.Config.WorkingDir = "/work"
	cf.Config.User = "1000:1000"
	cf.Config.Entrypoint = []string{"/bin/sh", "-c"}
	cf.Config.Cmd = []string{"echo hi"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func hostImage(t *testing.T, layers ...v1.Layer) v1.Image {
	return testImage(t, runtime.GOARCH, layers...)
}

// ociLayoutTar writes img as an OCI image layout and returns the layout as a tar.
func ociLayoutTar(t *testing.T, idx v1.ImageIndex) []byte {
	t.Helper()
	dir := t.TempDir()
	if _, err := layout.Write(dir, idx); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
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

func readLayerFile(t *testing.T, s *Store, diffID, rel string) string {
	t.Helper()
	d, err := s.LayerDir(diffID)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(d, rel))
	if err != nil {
		t.Fatalf("read %s of layer %s: %v", rel, diffID, err)
	}
	return string(b)
}

// tamperMember flips the last byte of the member name of a tar archive.
func tamperMember(t *testing.T, data []byte, member string) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	found := false
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name == member && len(body) > 0 {
			body[len(body)-1] ^= 0xff
			found = true
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	if !found {
		t.Fatalf("no member %s to tamper with", member)
	}
	return out.Bytes()
}
