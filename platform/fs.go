package platform

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// Op names a changing file-system operation, as FS.Fault sees it.
type Op string

// The operations FS makes, in the words FS.Fault is called with.
const (
	OpMkdir  Op = "mkdir"
	OpCreate Op = "create" // an open with O_CREATE (of a record's temp file, of a lock file)
	OpWrite  Op = "write"
	OpSync   Op = "fsync" // of a file or of a directory
	OpRename Op = "rename"
	OpUnlink Op = "unlink"
	OpRmdir  Op = "rmdir"
)

// FS makes the changing file-system calls of the stores: creating, writing, syncing,
// renaming and removing entries. Reads (stat, open for reading, listing) do not go through it:
// they change nothing, and a store must keep reading when its file system is full.
//
// The zero FS makes every call directly; it is the production value. A test sets Fault to
// make chosen calls fail as a full, read-only or failing disk would, at an exact step of an
// exact operation, without a full disk. FS is a value that a store's Options carry, not
// package state: two stores in one process (a test's faulty one and a checker's) never share
// it, and production code holds no hook that a test could leave set.
type FS struct {
	// Fault, if set, is called before each operation with the operation and the path of the
	// entry it changes (for a rename, the new name; for a sync, the synced file or
	// directory). A non-nil result is returned, as the real call's error would be (inside an
	// *os.PathError), instead of making the call.
	Fault func(op Op, path string) error
}

// fault asks Fault about op on name in dir (name "" for dir itself).
func (f FS) fault(op Op, dir *os.File, name string) error {
	if f.Fault == nil {
		return nil
	}
	path := dir.Name()
	if name != "" {
		path = filepath.Join(path, name)
	}
	return f.faultPath(op, path)
}

// faultPath asks Fault about op on path.
func (f FS) faultPath(op Op, path string) error {
	if f.Fault == nil {
		return nil
	}
	if err := f.Fault(op, path); err != nil {
		return &os.PathError{Op: string(op), Path: path, Err: err}
	}
	return nil
}

// creates reports whether making name in dir would create an entry, for Fault: the kernel
// looks a name up before it allocates anything, so a mkdir or an O_CREATE open of an entry
// that exists behaves the same on a full or read-only disk, and Fault is not asked about it.
func (f FS) creates(dir *os.File, name string) bool {
	_, err := LstatAt(dir, name)
	return errors.Is(err, fs.ErrNotExist)
}

// MkdirAt is [MkdirAt] through f.
func (f FS) MkdirAt(dir *os.File, name string, perm fs.FileMode) error {
	if f.Fault != nil && f.creates(dir, name) {
		if err := f.fault(OpMkdir, dir, name); err != nil {
			return err
		}
	}
	return MkdirAt(dir, name, perm)
}

// OpenFileAt is [OpenFileAt] through f; only an open with os.O_CREATE of a missing file is a
// change that Fault is asked about.
func (f FS) OpenFileAt(dir *os.File, name string, flag int, perm fs.FileMode) (*os.File, error) {
	if flag&os.O_CREATE != 0 && f.Fault != nil && f.creates(dir, name) {
		if err := f.fault(OpCreate, dir, name); err != nil {
			return nil, err
		}
	}
	return OpenFileAt(dir, name, flag, perm)
}

// UnlinkAt is [UnlinkAt] through f.
func (f FS) UnlinkAt(dir *os.File, name string) error {
	if err := f.fault(OpUnlink, dir, name); err != nil {
		return err
	}
	return UnlinkAt(dir, name)
}

// RmdirAt is [RmdirAt] through f.
func (f FS) RmdirAt(dir *os.File, name string) error {
	if err := f.fault(OpRmdir, dir, name); err != nil {
		return err
	}
	return RmdirAt(dir, name)
}

// SyncDir is [SyncDir] through f.
func (f FS) SyncDir(dir *os.File) error {
	if err := f.fault(OpSync, dir, ""); err != nil {
		return err
	}
	return SyncDir(dir)
}

// write is f.Write through f.
func (f FS) write(dir *os.File, name string, file *os.File, data []byte) error {
	if err := f.fault(OpWrite, dir, name); err != nil {
		return err
	}
	_, err := file.Write(data)
	return err
}

// sync is file.Sync through f.
func (f FS) sync(dir *os.File, name string, file *os.File) error {
	if err := f.fault(OpSync, dir, name); err != nil {
		return err
	}
	return file.Sync()
}
