package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// SandboxesDir is the directory under the state root that holds one state directory per sandbox.
const SandboxesDir = "sandboxes"

// RetryInterval is how often a waiter tries a busy lock again, and how often a removal that
// waits for its directory to empty looks again.
const RetryInterval = 25 * time.Millisecond

// Store is the sandbox store under one state root. Its methods are safe for concurrent use,
// and any number of processes may open stores on the same root: all coordination goes
// through the file system.
type Store struct {
	root string
	// sbx is a handle on root/sandboxes, opened once without following links; every state
	// directory is reached from it by one plain name, never by resolving a path again.
	sbx *os.File

	// fs makes every change on disk; Options.FS, the zero (direct) FS in production.
	fs platform.FS

	// trash is where removals move what they take out of state directories (TrashDir).
	trash *trash

	mu       sync.RWMutex
	declared map[string]declaration // keyed by the lowercased name

	// testHook, set only by tests, is called at fixed points of a lock attempt, so that tests
	// can interleave a concurrent removal exactly where the protocol must cope with one.
	testHook func(point string)
}

// The points at which testHook is called.
const (
	hookAttempt   = "attempt"    // an attempt starts
	hookMkdir     = "mkdir"      // a provision made (or found) the directory and will open it
	hookDirOpened = "dir-opened" // the state directory is open; the lock file is not yet
	hookOpened    = "opened"     // the lock file is open and about to be flocked
	hookFlocked   = "flocked"    // the flock is taken; the identity checks are next
	hookBusy      = "busy"       // an attempt found the lock held by another; a wait follows
	hookLocked    = "locked"     // the lock is held and checked: exclusion starts
	hookEnded     = "ended"      // the lock file is about to be unlinked or unlocked: exclusion ends
	hookUnlinked  = "unlinked"   // a removal unlinked its lock file and will remove the directory
)

func (s *Store) hook(point string) {
	if s.testHook != nil {
		s.testHook(point)
	}
}

// Options configure a Store. The zero value is the production configuration.
type Options struct {
	// FS makes the store's changes on disk. Tests set its Fault to fail chosen steps as a
	// full or failing disk would.
	FS platform.FS
}

// Open opens the store under root, creating root and root/sandboxes (mode 0700) if they are
// missing. It refuses a root, or a sandboxes directory, that is a link or not a directory.
func Open(root string) (*Store, error) { return OpenWith(root, Options{}) }

// OpenWith is Open with options.
func OpenWith(root string, opts Options) (_ *Store, err error) {
	defer func() { err = errcode.Storage(err, root) }()
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("store: state root %q: %w", root, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		// MkdirAll also fails when abs is a link to a non-directory; a link to a directory is
		// caught below.
		return nil, fmt.Errorf("store: create state root: %w", err)
	}
	rootDir, err := platform.OpenDir(abs)
	if err != nil {
		return nil, fmt.Errorf("store: state root %s must be a directory, not a link: %w", abs, err)
	}
	defer rootDir.Close()
	if err := opts.FS.MkdirAt(rootDir, SandboxesDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("store: create %s: %w", SandboxesDir, err)
	}
	sbx, err := platform.OpenDirAt(rootDir, SandboxesDir)
	if err != nil {
		return nil, fmt.Errorf("store: %s must be a directory, not a link: %w", SandboxesDir, err)
	}
	return &Store{root: abs, sbx: sbx, fs: opts.FS, trash: openTrash(opts.FS, rootDir), declared: map[string]declaration{}}, nil
}

// storage gives err the code of its storage fault, if it has one (see [errcode.Storage]):
// every error the store returns passes through it.
func (s *Store) storage(err error) error { return errcode.Storage(err, s.root) }

// Close releases the store's directory handles. Locks taken from it must be released first.
func (s *Store) Close() error { return errors.Join(s.sbx.Close(), s.trash.close()) }

// Root returns the absolute state root.
func (s *Store) Root() string { return s.root }

// Dir returns the absolute path of id's state directory (which need not exist). The id must
// be valid.
func (s *Store) Dir(id string) (string, error) {
	if err := ValidateID(id); err != nil {
		return "", err
	}
	return filepath.Join(s.root, SandboxesDir, id), nil
}

// Declare registers an entry that another component keeps in state directories (the exec
// lock, the clone binding, the runtime's files and directories), so that removal knows it as
// part of the sandbox rather than foreign. The name must be one plain file name of ASCII
// letters, digits, '.', '_' and '-', and, ignoring ASCII case, differ from the store's names,
// its temp-name form, ".nfs*" and every name declared before. Call it at start-up, before
// removals run: an undeclared entry makes a removal refuse with foreign-files.
func (s *Store) Declare(name string, kind EntryKind) error {
	if kind != EntryFile && kind != EntryDir {
		return errcode.Invalid("kind", "The entry kind %v is neither a file nor a directory.", kind)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := validateDeclaredName(name, s.declared); err != nil {
		return err
	}
	s.declared[strings.ToLower(name)] = declaration{name: name, kind: kind}
	return nil
}

// declaredKind returns how name was declared; names match exactly (the case-insensitive
// comparison is only for refusing collisions).
func (s *Store) declaredKind(name string) (EntryKind, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	d, ok := s.declared[strings.ToLower(name)]
	if !ok || d.name != name {
		return 0, false
	}
	return d.kind, true
}

// List returns the ids of the state directories, sorted. Entries that are not directories or
// whose names are not valid ids are skipped. A directory listed may be one that is being
// provisioned or removed: read its configuration record to know.
func (s *Store) List() ([]string, error) {
	names, err := platform.ReadDirNames(s.sbx)
	if err != nil {
		return nil, s.storage(fmt.Errorf("store: list sandboxes: %w", err))
	}
	ids := names[:0]
	for _, name := range names {
		if ValidateID(name) != nil {
			continue
		}
		st, err := platform.LstatAt(s.sbx, name)
		if err != nil || !st.IsDir() {
			continue
		}
		ids = append(ids, name)
	}
	sort.Strings(ids)
	return ids, nil
}
