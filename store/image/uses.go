package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// References. The store does not know sandboxes or templates, but it keeps, for its
// callers, a durable record of who uses each image: uses/<name>/<kind>-<hash>.json, one per
// user. A reference is written under the store's lock while the image exists, and an image
// is deleted (or replaced by other content) under the same lock only when it has none, so
// that no user is ever left on an image that is gone. Which references are stale (a sandbox
// that no longer exists, a generation retired) is for the caller to judge: see
// [Tx.RemoveUse] and bothyd check.

// UseKind is what uses an image.
type UseKind string

// The kinds of users.
const (
	// UseSandbox is a sandbox provisioned on the image; its ID is the sandbox id.
	UseSandbox UseKind = "sandbox"
	// UseGeneration is a template generation captured on the image; its ID is
	// "<template>/<generation>".
	UseGeneration UseKind = "generation"
)

const useFormat = 1

// Use is one reference to an image.
type Use struct {
	Format  int       `json:"format"`
	Image   string    `json:"image"`
	Kind    UseKind   `json:"kind"`
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
}

func (u Use) String() string { return string(u.Kind) + " " + u.ID }

// useFile names the reference of (kind, id): the id is hashed, so that any id (a generation's
// holds a slash) is a safe file name, and the kind stays readable.
func useFile(kind UseKind, id string) string {
	sum := sha256.Sum256([]byte(string(kind) + "\x00" + id))
	return string(kind) + "-" + hex.EncodeToString(sum[:16]) + refExt
}

func validKind(k UseKind) bool { return k == UseSandbox || k == UseGeneration }

// inUse is the refusal of an operation that would take an image from its users.
func inUse(name string, uses []Use) error {
	who := make([]string, 0, len(uses))
	for _, u := range uses {
		who = append(who, u.String())
	}
	const shown = 10
	more := ""
	if len(who) > shown {
		more = fmt.Sprintf(" and %d more", len(who)-shown)
		who = who[:shown]
	}
	return errcode.New(errcode.ImageInUse,
		"Image %s is in use by %s%s; delete those sandboxes and retire those generations first.", name, strings.Join(who, ", "), more)
}

// Get returns the record of the image name, read under the lock.
func (tx *Tx) Get(name string) (*Image, error) { return tx.s.Get(name) }

// AddUse records durably that (kind, id) uses the image name, which must exist. created
// says the reference is new (false: it was there already, which a caller that undoes its
// work on failure must not remove).
func (tx *Tx) AddUse(name string, kind UseKind, id string) (created bool, err error) {
	if !validKind(kind) || id == "" {
		return false, fmt.Errorf("image: a reference needs a kind and an id, not %q %q", kind, id)
	}
	if _, err := tx.s.Get(name); err != nil {
		return false, err
	}
	if err := platform.MkdirAt(tx.s.uses, name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return false, err
	}
	dir, err := platform.OpenDirAt(tx.s.uses, name)
	if err != nil {
		return false, err
	}
	defer dir.Close()
	file := useFile(kind, id)
	if _, err := platform.LstatAt(dir, file); err == nil {
		return false, nil
	}
	data, err := record.Encode(&Use{Format: useFormat, Image: name, Kind: kind, ID: id, Created: time.Now().UTC()})
	if err != nil {
		return false, err
	}
	if err := platform.WriteFileDurableAt(dir, file, data, record.Perm); err != nil {
		return false, err
	}
	// The directory entry of uses/<name> may be new: make it durable too.
	return true, platform.SyncDir(tx.s.uses)
}

// RemoveUse removes the reference of (kind, id) to the image name durably; a reference that
// is not there is not an error.
func (tx *Tx) RemoveUse(name string, kind UseKind, id string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	dir, err := platform.OpenDirAt(tx.s.uses, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := platform.UnlinkAt(dir, useFile(kind, id)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return platform.SyncDir(dir)
}

// Uses returns the references to the image name, by kind and id.
func (tx *Tx) Uses(name string) ([]Use, error) { return tx.s.Uses(name) }

// AllUses returns every reference the store holds, by image, kind and id, for the checker.
func (tx *Tx) AllUses() ([]Use, error) {
	names, err := platform.ReadDirNames(tx.s.uses)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []Use
	for _, n := range names {
		if ValidateName(n) != nil {
			continue // Check reports it
		}
		u, err := tx.s.Uses(n)
		if err != nil {
			return nil, err
		}
		out = append(out, u...)
	}
	return out, nil
}

// Uses returns the references to the image name, by kind and id, without the lock (a
// reference is one durable file, written whole). A reference that does not read is left
// out; Check reports it.
func (s *Store) Uses(name string) ([]Use, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	dir, err := platform.OpenDirAt(s.uses, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	files, err := platform.ReadDirNames(dir)
	if err != nil {
		return nil, err
	}
	var out []Use
	for _, f := range files {
		if u, err := readUse(dir, name, f); err == nil {
			out = append(out, *u)
		}
	}
	slices.SortFunc(out, func(a, b Use) int {
		return strings.Compare(string(a.Kind)+"\x00"+a.ID, string(b.Kind)+"\x00"+b.ID)
	})
	return out, nil
}

// readUse reads one reference, refusing one that does not read or whose name is not its own.
func readUse(dir *os.File, image, file string) (*Use, error) {
	if !strings.HasSuffix(file, refExt) {
		return nil, fmt.Errorf("not a reference")
	}
	data, err := platform.ReadFileAt(dir, file, record.MaxSize)
	if err != nil {
		return nil, err
	}
	var u Use
	if err := record.Decode("image reference "+file, data, useFormat, &u); err != nil {
		return nil, err
	}
	if u.Image != image || !validKind(u.Kind) || useFile(u.Kind, u.ID) != file {
		return nil, fmt.Errorf("the reference %s names %s %s of image %q", file, u.Kind, u.ID, u.Image)
	}
	return &u, nil
}

// Delete removes the record of the image name, refusing with image-in-use while any
// reference to it remains: the check and the removal are under the same lock that every
// reference is written under. The layers that no other image names are removed too, unless
// a pull or import is live (see collect.go); their files go when the lock is released.
func (tx *Tx) Delete(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	img, err := tx.s.Get(name)
	if err != nil {
		return err
	}
	uses, err := tx.s.Uses(name)
	if err != nil {
		return err
	}
	if len(uses) > 0 {
		return inUse(name, uses)
	}
	if err := platform.UnlinkAt(tx.s.refs, name+refExt); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errcode.New(errcode.ImageNotFound, "There is no image %q.", name)
		}
		return err
	}
	if err := platform.SyncDir(tx.s.refs); err != nil {
		return err
	}
	// The empty reference directory goes too; one that is not empty (a reference that does
	// not read) stays for Check to report.
	_ = platform.RmdirAt(tx.s.uses, name)
	// Its layers go with it, those no other image uses (see collect.go).
	if err := tx.collectLayers(img.Layers); err != nil {
		return errcode.Wrap(errcode.Internal, err, "Image %s is deleted, but not all of its layers could be removed (%v); bothyd check reports what is left and --repair removes it.", name, err)
	}
	return nil
}
