package check

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/bothy/bothy/store/image"
	"github.com/bothy/bothy/store/template"
)

// The kinds of image problem the checker reports besides the image store's own
// (image.ProblemKind values, reported as they are).
const (
	// StaleImageReference is a reference to an image whose user is gone: a sandbox deleted, or
	// a generation retired, by a process that stopped before it released the reference (or a
	// provision that died between the two). It keeps the image from being deleted; repair
	// removes it.
	StaleImageReference = "stale-image-reference"
	ImageStoreSkipped   = "image-store-unusable"
)

// checkImages runs the image store's own check and judges its references against the
// sandbox and template stores, under the image store's lock, which every reference is written
// under. With repair it repairs what is safe (see [image.Store.Check] and
// [supervisor.Supervisor.CheckImageUses]).
func (c *checker) checkImages(ctx context.Context, p *pass, repair bool) {
	entry := filepath.Join(image.ImagesDir, image.StoreDir)
	if c.imagesErr != nil {
		p.add(ImageStoreSkipped, "", entry, "cannot open the image store: %v", c.imagesErr)
		return
	}
	if c.images == nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, c.o.LockTimeout)
	defer cancel()
	probs, err := c.images.Check(lctx, repair)
	if err != nil {
		p.add(ImageStoreSkipped, "", entry, "the image store's check failed: %v", err)
		return
	}
	if !repair {
		for _, ip := range probs {
			pr := Problem{Kind: string(ip.Kind), Entry: filepath.Join(entry, ip.Entry), Detail: ip.Detail}
			if ip.Kind == image.UnreferencedLayer {
				// Not an inconsistency: a layer a live pull has just unpacked, or one a
				// failed pull left for its retry (see image.UnreferencedLayer).
				pr.Detail += "; bothyd's next start or check --repair removes it"
				p.notes = append(p.notes, pr)
				continue
			}
			p.problems = append(p.problems, pr)
		}
	}
	stale, err := c.sup.CheckImageUses(lctx, repair)
	if err != nil {
		p.add(ImageStoreSkipped, "", entry, "the image references could not be checked: %v", err)
	}
	if !repair {
		for _, u := range stale {
			sandbox := ""
			if u.Kind == image.UseSandbox {
				sandbox = u.ID
			}
			p.add(StaleImageReference, sandbox, filepath.Join(entry, image.UsesDir, u.Image),
				"image %s is referenced by %s, which no longer exists", u.Image, u.String())
		}
	}
}

// openImageStores opens the image store and the template store of root, each only if it
// exists: a check creates neither.
func openImageStores(root string) (*image.Store, *template.Store, error) {
	if _, err := os.Lstat(filepath.Join(root, image.ImagesDir, image.StoreDir)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	imgs, err := image.Open(root, image.Options{})
	if err != nil {
		return nil, nil, err
	}
	var ts *template.Store
	if _, err := os.Lstat(filepath.Join(root, template.TemplatesDir)); err == nil {
		if ts, err = template.Open(root, template.Options{}); err != nil {
			ts = nil // the template check reports it; generations are then not judged
		}
	}
	return imgs, ts, nil
}
