package image

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// add makes every layer of src present and then writes the image record name under the
// store's lock. The caller holds a work lock, so no Repair removes a layer between its
// unpacking and the record that references it.
func (s *Store) add(ctx context.Context, name string, src *Source, progress Progress) (*Image, error) {
	cfg, err := s.checkSource(src)
	if err != nil {
		return nil, err
	}
	img := &Image{
		Name: name, Ref: src.Ref, ManifestDigest: src.ManifestDigest,
		ConfigDigest: digestOf(sha256Sum(src.Config)), Platform: cfg.platform(),
		Layers: slices.Clone(cfg.RootFS.DiffIDs), Config: cfg.shown(),
	}
	for i, sl := range src.Layers {
		rec, present, err := s.ensureLayer(ctx, i, img.Layers[i], sl, progress)
		if err != nil {
			return nil, fmt.Errorf("image: layer %d (%s): %w", i, img.Layers[i], err)
		}
		if present && progress != nil {
			progress(LayerProgress{Index: i, DiffID: img.Layers[i], Done: sl.Size, Total: sl.Size, Present: true})
		}
		img.Size += rec.Stats.Bytes
	}
	if err := s.commit(ctx, img); err != nil {
		return nil, err
	}
	return img, nil
}

func sha256Sum(b []byte) []byte {
	sum := sha256.Sum256(b)
	return sum[:]
}

// checkSource checks what can be checked of src before anything is read: the configuration
// against its digest, the layer count against the diff ids, the digests' forms.
func (s *Store) checkSource(src *Source) (*imageConfig, error) {
	if _, err := digestHex(src.ManifestDigest); err != nil {
		return nil, badArchive("the manifest digest %q is not a sha256 digest", src.ManifestDigest)
	}
	if src.ConfigDigest != "" {
		if got := digestOf(sha256Sum(src.Config)); got != src.ConfigDigest {
			return nil, digestMismatch("image configuration", src.ConfigDigest, got)
		}
	}
	cfg, err := parseConfig(src.Config)
	if err != nil {
		return nil, err
	}
	if len(src.Layers) == 0 {
		// Nothing to run: refused here, where the image comes in, not at each create.
		return nil, badArchive("it has no layers, so a sandbox would have no files to run")
	}
	if len(src.Layers) > MaxLayers {
		return nil, tooLarge("it has %d layers, more than the %d bothyd stacks", len(src.Layers), MaxLayers)
	}
	if len(cfg.RootFS.DiffIDs) != len(src.Layers) {
		return nil, badArchive("the manifest has %d layers but the configuration %d diff ids", len(src.Layers), len(cfg.RootFS.DiffIDs))
	}
	for i, sl := range src.Layers {
		if sl.Digest != "" {
			if _, err := digestHex(sl.Digest); err != nil {
				return nil, badArchive("layer %d's digest %q is not a sha256 digest", i, sl.Digest)
			}
		}
		if sl.Open == nil {
			return nil, fmt.Errorf("image: layer %d of the source has no Open", i)
		}
	}
	return cfg, nil
}

// commit writes img's record under the store's lock, after checking that its layers are
// still whole.
func (s *Store) commit(ctx context.Context, img *Image) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	tx, err := s.Lock(ctx)
	if err != nil {
		return err
	}
	defer tx.Unlock()
	for _, d := range img.Layers {
		hexID, _ := digestHex(d)
		if _, ok := s.presentLayer(hexID); !ok {
			return errcode.New(errcode.Internal, "The layer %s of image %s went missing before the image was recorded; pull or import it again.", d, img.Name)
		}
	}
	// An image in use keeps its content: its users stack its layers by name. The same
	// content again (a pull that found nothing new) is no change.
	if old, err := readImage(s.refs, img.Name); err == nil && !slices.Equal(old.Layers, img.Layers) {
		uses, err := s.Uses(img.Name)
		if err != nil {
			return err
		}
		if len(uses) > 0 {
			return inUse(img.Name, uses)
		}
	}
	img.Created = time.Now().UTC()
	return writeImage(s.refs, img)
}

// Get returns the record of the image name.
func (s *Store) Get(name string) (*Image, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	return readImage(s.refs, name)
}

// List returns the records of all images, by name. A record that does not read is left out
// (Check reports it).
func (s *Store) List() ([]*Image, error) {
	names, err := platform.ReadDirNames(s.refs)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []*Image
	for _, n := range names {
		name, ok := strings.CutSuffix(n, refExt)
		if !ok || ValidateName(name) != nil {
			continue
		}
		if img, err := readImage(s.refs, name); err == nil {
			out = append(out, img)
		}
	}
	return out, nil
}

// LayerDirs returns the overlay lower directories of the image name, top layer first, as
// overlayfs's lowerdir option lists them.
func (s *Store) LayerDirs(name string) ([]string, error) {
	img, err := s.Get(name)
	if err != nil {
		return nil, err
	}
	dirs := make([]string, 0, len(img.Layers))
	for i := len(img.Layers) - 1; i >= 0; i-- {
		d, err := s.LayerDir(img.Layers[i])
		if err != nil {
			return nil, err
		}
		dirs = append(dirs, d)
	}
	return dirs, nil
}

// Delete removes the record of the image name, refusing with image-in-use while a
// reference to it remains, and the layers no other image names (see [Tx.Delete]).
func (s *Store) Delete(ctx context.Context, name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	tx, err := s.Lock(ctx)
	if err != nil {
		return err
	}
	defer tx.Unlock()
	return tx.Delete(name)
}
