package check

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/store/image"
	"github.com/sandboxd/sandboxd/store/template"
	"github.com/sandboxd/sandboxd/supervisor"
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
	storeDir := filepath.Join(c.root, image.ImagesDir, image.StoreDir)
	if _, err := os.Lstat(storeDir); errors.Is(err, fs.ErrNotExist) {
		return // no image was ever pulled or imported; do not create the store for a check
	}
	entry := filepath.Join(image.ImagesDir, image.StoreDir)
	imgs, err := image.Open(c.root, image.Options{})
	if err != nil {
		p.add(ImageStoreSkipped, "", entry, "cannot open the image store: %v", err)
		return
	}
	defer imgs.Close()
	var ts *template.Store
	if _, err := os.Lstat(filepath.Join(c.root, template.TemplatesDir)); err == nil {
		if ts, err = template.Open(c.root, template.Options{}); err == nil {
			defer ts.Close()
		}
	}
	sup, err := supervisor.New(supervisor.Options{Store: c.st, Runtime: c.rt, Images: imgs, Templates: ts, Logger: c.o.Logger})
	if err != nil {
		p.add(ImageStoreSkipped, "", entry, "cannot judge the image store's references: %v", err)
		return
	}
	defer sup.Close()
	lctx, cancel := context.WithTimeout(ctx, c.o.LockTimeout)
	defer cancel()
	probs, err := imgs.Check(lctx, repair)
	if err != nil {
		p.add(ImageStoreSkipped, "", entry, "the image store's check failed: %v", err)
		return
	}
	if !repair {
		for _, ip := range probs {
			p.problems = append(p.problems, Problem{Kind: string(ip.Kind), Entry: filepath.Join(entry, ip.Entry), Detail: ip.Detail})
		}
	}
	stale, err := sup.CheckImageUses(lctx, repair)
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
