//go:build linux

package image

import (
	"bytes"
	"crypto/sha256"
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// diskUsage is the space the files below root take on disk (allocated blocks, as du counts).
func diskUsage(t *testing.T, root string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// TestSharedBaseDiskUsage: two images that share a base layer take the base's space once. It
// logs the disk used by each image alone and by both in one store (issue 15's figure), and
// fails if the pair takes more than one base and two tops.
func TestSharedBaseDiskUsage(t *testing.T) {
	needRoot(t)
	t.Parallel()
	// A 32 MiB base of incompressible files (16 of 2 MiB), and a small top for each image.
	var ents []ent
	for i := range 16 {
		var buf bytes.Buffer
		seed := sha256.Sum256([]byte{byte(i)})
		for buf.Len() < 2<<20 {
			seed = sha256.Sum256(seed[:])
			buf.Write(seed[:])
		}
		ents = append(ents, file("base/f"+string(rune('a'+i)), buf.String()))
	}
	base := gcrLayer(t, tarOf(t, ents...))
	one := hostImage(t, base, gcrLayer(t, tarOf(t, file("one", "1"))))
	two := hostImage(t, base, gcrLayer(t, tarOf(t, file("two", "2"))))
	layout := func(img v1.Image) []byte {
		return ociLayoutTar(t, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img}))
	}
	used := func(names ...string) int64 {
		s, _ := openStore(t, Options{})
		for _, n := range names {
			img := one
			if n == "two" {
				img = two
			}
			if _, err := s.Import(ctxT(t), n, bytes.NewReader(layout(img)), nil); err != nil {
				t.Fatal(err)
			}
		}
		return diskUsage(t, filepath.Join(s.Path(), LayersDir))
	}
	a, b, both := used("one"), used("two"), used("one", "two")
	t.Logf("layer store on disk: image one alone %d KiB, image two alone %d KiB, both %d KiB (%.2f of the sum)",
		a>>10, b>>10, both>>10, float64(both)/float64(a+b))
	if both >= a+b-(16<<20) {
		t.Fatalf("both images take %d bytes, alone %d and %d: the shared base is not stored once", both, a, b)
	}
}
