package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/bothy/bothy/platform"
)

// A deleted image's layers are removed by its deletion, not left for the next start: an
// operator deletes an image to free its disk, and `bothyd check` run meanwhile must find the
// store consistent. Only a layer that no other image record names goes, and only while no
// pull or import is live: a live one may have found the layer present and be about to
// record an image on it (see [Store.Check], which holds the same rule). The layers left then
// are unreferenced until the next start or `check --repair` removes them.
//
// A layer is detached under the store's lock and removed after it: it is locked (flock) and
// renamed to a temporary name, ".<hex>.<random>.tmp", so that from then on no pull finds it
// present and Check takes it for a live unpacker's; the files go once the store's lock is
// released, so that a large layer does not hold up the store. A crash in between leaves a
// temporary name no one holds, which Check reports as half-unpacked and repair removes.

// liveWork counts the pulls and imports whose work locks are held. The caller holds the
// store's lock, under which work locks are taken.
func (s *Store) liveWork() (int, error) {
	names, err := platform.ReadDirNames(s.work)
	if err != nil {
		return 0, err
	}
	live := 0
	for _, n := range names {
		if !strings.HasSuffix(n, ".lock") {
			continue
		}
		h, err := held(s.work, n, false)
		if err != nil {
			return 0, err
		}
		if h {
			live++
		}
	}
	return live, nil
}

// referencedLayers returns the diff ids that the image records name; a record that does
// not read counts as naming nothing it could be sure of, so its presence makes the result
// unusable (ok false): no layer is collected while Check has a bad record to report.
func (s *Store) referencedLayers() (map[string]bool, bool, error) {
	names, err := platform.ReadDirNames(s.refs)
	if err != nil {
		return nil, false, err
	}
	refs := make(map[string]bool)
	for _, n := range names {
		name, ok := strings.CutSuffix(n, refExt)
		if !ok || ValidateName(name) != nil {
			continue // temporary files and foreign entries name no layer
		}
		img, err := readImage(s.refs, name)
		if err != nil {
			return nil, false, nil
		}
		for _, d := range img.Layers {
			refs[d] = true
		}
	}
	return refs, true, nil
}

// detached is a layer renamed out of the way under the store's lock, its directory locked,
// to be removed once the lock is released.
type detached struct {
	dir  *os.File
	path string
}

// collectLayers detaches the layers of layers that no image record names, when no pull or
// import is live. It is called under the store's lock by the deletion of an image, with
// that image's layers.
func (tx *Tx) collectLayers(layers []string) error {
	s := tx.s
	if live, err := s.liveWork(); err != nil || live > 0 {
		return err
	}
	refs, ok, err := s.referencedLayers()
	if err != nil || !ok {
		return err
	}
	var errs []error
	seen := make(map[string]bool)
	for _, d := range layers {
		if refs[d] || seen[d] {
			continue
		}
		seen[d] = true
		hexID, err := digestHex(d)
		if err != nil {
			continue
		}
		if err := tx.detach(hexID); err != nil {
			errs = append(errs, fmt.Errorf("image: remove the layer %s: %w", d, err))
		}
	}
	if len(tx.detached) > 0 {
		errs = append(errs, platform.SyncDir(s.layers))
	}
	return errors.Join(errs...)
}

// detach locks the layer hexID's directory and renames it to a temporary name.
func (tx *Tx) detach(hexID string) error {
	s := tx.s
	d, err := platform.OpenDirAt(s.layers, hexID)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if got, err := platform.TryLock(d); err != nil || !got {
		d.Close()
		return errors.Join(err, errors.New("its directory is locked by someone else"))
	}
	tmp := platform.TempName(hexID)
	if err := renameNoReplace(s.layers, hexID, tmp); err != nil {
		d.Close()
		return err
	}
	tx.detached = append(tx.detached, detached{dir: d, path: filepath.Join(s.layers.Name(), tmp)})
	return nil
}

// removeDetached removes the detached layers' files; it runs after the store's lock is
// released. A layer whose removal fails stays under its temporary name, unlocked once its
// directory is closed, for Check to report and repair.
func (tx *Tx) removeDetached() error {
	var errs []error
	for _, d := range tx.detached {
		errs = append(errs, os.RemoveAll(d.path), d.dir.Close())
	}
	tx.detached = nil
	return errors.Join(errs...)
}
