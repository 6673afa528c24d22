package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/store"
)

// The layout of the store below the state root. ImagesDir is shared with the root
// filesystem directories that an operator puts there and with the runtime's ".host"; the
// store owns StoreDir alone, whose name no image directory can have.
const (
	ImagesDir  = "images"
	StoreDir   = ".oci"
	LockName   = "images.lock"
	LayersDir  = "layers"  // layers/sha256/<hex>/{layer.json,fs/}
	RefsDir    = "refs"    // refs/<name>.json, one image record per local name
	WorkDir    = "work"    // work/<key>.lock, held by every live pull and import
	StagingDir = "staging" // staging/<key>/, an import's spooled archive members
	UsesDir    = "uses"    // uses/<name>/<kind>-<hash>.json, one reference per user of an image
	Algorithm  = "sha256"
	LayerFS    = "fs"
	LayerRec   = "layer.json"
)

// Default bounds; Options may lower or raise them.
const (
	DefaultMaxLayerBytes   = 16 << 30
	DefaultMaxEntries      = 1 << 20
	DefaultMaxArchiveBytes = 32 << 30
	// MaxLayers bounds the layers of one image, pulled or imported. Docker's overlay
	// driver stacks at most 128 (and refuses to build more), so no image that runs
	// elsewhere has more; a hostile manifest of thousands would cost a descriptor, a record
	// and a lower directory each.
	MaxLayers = 128
	// maxArchiveMembers bounds the members of an imported archive; an image has a few
	// hundred layers at most, each one or a few members.
	maxArchiveMembers = 10000
)

// Limits bound what one layer may hold once decompressed.
type Limits struct {
	MaxLayerBytes int64 // bytes of the layer's tar stream, and of its compressed form
	MaxEntries    int   // tar entries
}

// Options configure a Store. The zero value is the production configuration.
type Options struct {
	Limits
	// MaxArchiveBytes bounds the bytes an import reads.
	MaxArchiveBytes int64
	// Fetcher resolves a reference for Pull; without one Pull is refused. The store knows
	// no registry protocol: store/image/registry implements one.
	Fetcher Fetcher
	// Platform is the "os/arch[/variant]" an index is resolved to; the host's when empty.
	Platform string
}

// Errors that the store's refusals wrap, for errors.Is.
var (
	// ErrUnsafeEntry is wrapped by the refusal of a layer entry that could write outside
	// its layer or that the layer format does not allow.
	ErrUnsafeEntry = errors.New("unsafe layer entry")
	// ErrTooLarge is wrapped by the refusal of a layer or archive beyond a bound.
	ErrTooLarge = errors.New("image beyond a bound")
	// ErrDigestMismatch is wrapped by the refusal of content whose digest is not the one
	// that names it.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrBadArchive is wrapped by the refusal of an archive that is neither a docker save
	// archive nor an OCI image layout, or is malformed.
	ErrBadArchive = errors.New("not an image archive")
)

func unsafeEntry(name, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return errcode.Wrap(errcode.InvalidRequest, fmt.Errorf("%w %q: %s", ErrUnsafeEntry, name, msg),
		"The layer entry %q is refused: %s.", name, msg)
}

func tooLarge(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return errcode.Wrap(errcode.PayloadTooLarge, fmt.Errorf("%w: %s", ErrTooLarge, msg), "The image is too large: %s.", msg)
}

func digestMismatch(what, want, got string) error {
	return errcode.Wrap(errcode.InvalidRequest, fmt.Errorf("%w: %s: want %s, got %s", ErrDigestMismatch, what, want, got),
		"The %s does not match its digest (%s expected, %s read); the image is damaged or was tampered with.", what, want, got)
}

func badArchive(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return errcode.Wrap(errcode.InvalidRequest, fmt.Errorf("%w: %s", ErrBadArchive, msg),
		"The archive is not an image bothyd can import: %s.", msg)
}

// nameRule is the local name (alias) of an image: the rule of the image names that the
// supervisor already accepts for directories under images/.
var nameRule = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// NameShape reports whether name has the shape of an image's name: any name an image list
// may hold ("host" too, which ValidateName keeps for the host's own file system).
func NameShape(name string) bool { return nameRule.MatchString(name) }

// ValidateName checks a local image name.
func ValidateName(name string) error {
	if !nameRule.MatchString(name) || name == "host" {
		return errcode.Invalid("name", "The image name %q is not valid: use 1-63 of a-z 0-9 . _ - starting with a letter or digit, other than \"host\".", name)
	}
	return nil
}

// Store is the image store under <state root>/images/.oci. Its methods are safe for
// concurrent use, and any number of processes may open stores on one root.
type Store struct {
	path   string   // absolute path of the store's directory
	dir    *os.File // the store's directory
	layers *os.File // layers/sha256
	refs   *os.File
	work   *os.File
	stage  *os.File
	uses   *os.File
	opts   Options

	mu      sync.Mutex
	flights map[string]*flight
}

// Open opens the image store under the state root stateRoot, creating what is missing (mode
// 0700). A directory of the store that is a link, not a directory, or not private to
// bothyd's user is refused.
func Open(stateRoot string, opts Options) (*Store, error) {
	if opts.MaxLayerBytes <= 0 {
		opts.MaxLayerBytes = DefaultMaxLayerBytes
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxArchiveBytes <= 0 {
		opts.MaxArchiveBytes = DefaultMaxArchiveBytes
	}
	abs, err := filepath.Abs(stateRoot)
	if err != nil {
		return nil, fmt.Errorf("image: state root %q: %w", stateRoot, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("image: create state root: %w", err)
	}
	s := &Store{path: filepath.Join(abs, ImagesDir, StoreDir), opts: opts, flights: make(map[string]*flight)}
	root, err := platform.OpenDir(abs)
	if err != nil {
		return nil, fmt.Errorf("image: state root %s must be a directory, not a link: %w", abs, err)
	}
	defer root.Close()
	images, err := ensurePrivateDir(root, ImagesDir)
	if err != nil {
		return nil, err
	}
	defer images.Close()
	if s.dir, err = ensurePrivateDir(images, StoreDir); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	ldir, err := ensurePrivateDir(s.dir, LayersDir)
	if err != nil {
		return nil, err
	}
	s.layers, err = ensurePrivateDir(ldir, Algorithm)
	ldir.Close()
	if err != nil {
		return nil, err
	}
	if s.refs, err = ensurePrivateDir(s.dir, RefsDir); err != nil {
		return nil, err
	}
	if s.work, err = ensurePrivateDir(s.dir, WorkDir); err != nil {
		return nil, err
	}
	if s.stage, err = ensurePrivateDir(s.dir, StagingDir); err != nil {
		return nil, err
	}
	if s.uses, err = ensurePrivateDir(s.dir, UsesDir); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// ensurePrivateDir creates name in dir (0700) if it is missing and opens it, refusing a link,
// a non-directory, and a directory that others can enter.
func ensurePrivateDir(dir *os.File, name string) (*os.File, error) {
	if err := platform.MkdirAt(dir, name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("image: create %s: %w", filepath.Join(dir.Name(), name), err)
	}
	d, err := platform.OpenDirAt(dir, name)
	if err != nil {
		return nil, fmt.Errorf("image: %s must be a directory, not a link: %w", filepath.Join(dir.Name(), name), err)
	}
	st, err := platform.StatOf(d)
	if err != nil {
		d.Close()
		return nil, err
	}
	if st.UID != uint32(os.Geteuid()) || st.Mode.Perm()&0o077 != 0 {
		d.Close()
		return nil, fmt.Errorf("image: %s is not private to bothyd's user (owner %d, mode %v); fix its owner and mode (0700)", d.Name(), st.UID, st.Mode.Perm())
	}
	return d, nil
}

// Close releases the store's directory handles.
func (s *Store) Close() error {
	var errs []error
	for _, f := range []*os.File{s.dir, s.layers, s.refs, s.work, s.stage, s.uses} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// Path returns the absolute path of the store's directory (<root>/images/.oci).
func (s *Store) Path() string { return s.path }

// LayerDir returns the directory of the layer diffID ("sha256:<hex>") that an overlay
// stacks as a lower layer: the layer's fs directory.
func (s *Store) LayerDir(diffID string) (string, error) {
	hexID, err := digestHex(diffID)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.path, LayersDir, Algorithm, hexID, LayerFS), nil
}

// digestHex returns the hex part of a "sha256:<64 hex>" digest, refusing any other form (so
// that the result is safe as a path component).
func digestHex(d string) (string, error) {
	const prefix = Algorithm + ":"
	if len(d) != len(prefix)+64 || d[:len(prefix)] != prefix || !isHex64(d[len(prefix):]) {
		return "", errcode.Invalid("digest", "The digest %q is not of the form sha256:<64 lowercase hex digits>.", d)
	}
	return d[len(prefix):], nil
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func digestOf(sum []byte) string { return Algorithm + ":" + hex.EncodeToString(sum) }

// Tx is a held store lock: an flock on .oci/images.lock. Records are written and layers
// are collected under it; unpacking is not (it runs under a work lock, see [Store.Pull]).
type Tx struct {
	f *os.File
	s *Store
	// detached are the layers a deletion took out of the store, removed once the lock is
	// released (see collect.go).
	detached []detached
}

// Unlock releases the lock, then removes the files of the layers a deletion under it
// detached.
func (tx *Tx) Unlock() error {
	err := errors.Join(platform.Unlock(tx.f), tx.f.Close())
	return errors.Join(err, tx.removeDetached())
}

func storeBusy() error {
	return errcode.New(errcode.TransitionInProgress,
		"Another image operation is still in progress; try again when it has finished, or give a longer timeout.")
}

// Lock takes the store's lock, tried every 25 ms until ctx's deadline (which ctx must have),
// then transition-in-progress.
func (s *Store) Lock(ctx context.Context) (*Tx, error) {
	var tx *Tx
	err := store.Retry(ctx, storeBusy, func() (store.Attempt, error) {
		f, res, err := tryLockFile(s.dir, LockName)
		if res == store.Acquired {
			tx = &Tx{f: f, s: s}
		}
		return res, err
	})
	return tx, err
}

// tryLockFile tries once to flock the file name in dir, creating it if missing. The lock
// counts only while the entry still names the file locked (a lock file removed and made
// anew by another process is Raced), so that no two holders ever exist.
func tryLockFile(dir *os.File, name string) (*os.File, store.Attempt, error) {
	f, err := platform.OpenFileAt(dir, name, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, store.Failed, errcode.Wrap(errcode.Internal, err, "The image store's lock file %s is not a regular file; remove it by hand.", name)
	}
	got, err := platform.TryLock(f)
	if err != nil || !got {
		f.Close()
		if err != nil {
			return nil, store.Failed, err
		}
		return nil, store.Busy, nil
	}
	st, serr := platform.LstatAt(dir, name)
	id, ierr := platform.IDOf(f)
	if serr != nil || ierr != nil || st.ID != id {
		f.Close()
		if errors.Is(serr, fs.ErrNotExist) || (serr == nil && ierr == nil) {
			return nil, store.Raced, nil
		}
		return nil, store.Failed, errors.Join(serr, ierr)
	}
	return f, store.Acquired, nil
}

// workLock is a held work lock: .oci/work/<key>.lock, held for the whole of a pull or an
// import. While any is held, Repair removes no layer (see [Store.Check]).
type workLock struct {
	s      *Store
	name   string
	f      *os.File
	remove bool // the holder removes the file when done (imports; pulls leave theirs for Check)
}

func (w *workLock) release() error {
	var err error
	if w.remove {
		err = platform.UnlinkAt(w.s.work, w.name)
	}
	return errors.Join(err, w.f.Close())
}

// lockWork takes the work lock key under the store's lock, so that a Check, which holds the
// store's lock throughout, either sees it held or runs entirely before the work starts.
func (s *Store) lockWork(ctx context.Context, key string, remove bool) (*workLock, error) {
	name := key + ".lock"
	busy := func() error {
		return errcode.New(errcode.TransitionInProgress, "Another pull or import of this image is still in progress; try again when it has finished, or give a longer timeout.")
	}
	var w *workLock
	err := store.Retry(ctx, busy, func() (store.Attempt, error) {
		tf, res, err := tryLockFile(s.dir, LockName)
		if res != store.Acquired {
			return res, err
		}
		defer func() { _ = platform.Unlock(tf); tf.Close() }()
		f, res, err := tryLockFile(s.work, name)
		if res == store.Acquired {
			w = &workLock{s: s, name: name, f: f, remove: remove}
		}
		return res, err
	})
	return w, err
}

// pullKey is the work lock key of pulls of ref: a pull of one ref in another process waits
// for this one and then finds its layers present.
func pullKey(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return "pull-" + hex.EncodeToString(sum[:16])
}

func importKey() string { return "import-" + naming.RandomHex(16) }
