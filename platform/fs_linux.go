//go:build linux

package platform

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WriteFileDurableAt is [WriteFileDurableAt] through f: the temp file's creation, its write,
// its fsync, the rename and the directory's fsync each ask f.Fault first, and so does the
// removal of the temp file after a failure.
func (f FS) WriteFileDurableAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return f.writeFileAt(dir, name, data, perm, syncName)
}

// WriteFileWholeAt is [WriteFileWholeAt] through f, asking f.Fault as WriteFileDurableAt
// does about each of its steps (it has one fsync, of the file).
func (f FS) WriteFileWholeAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return f.writeFileAt(dir, name, data, perm, syncContent)
}

// WriteFileAtomicAt is [WriteFileAtomicAt] through f, asking f.Fault as WriteFileDurableAt
// does about each of its steps (it has no fsync).
func (f FS) WriteFileAtomicAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return f.writeFileAt(dir, name, data, perm, syncNothing)
}

// writeSync says how much of a replacement writeFileAt makes survive a crash of the host.
type writeSync int

const (
	syncNothing writeSync = iota // no fsync: the page cache only
	syncContent                  // the new file's content: the old file or the new, whole
	syncName                     // the content and the directory: the new file
)

// writeFileAt replaces name in dir with data through a temporary file renamed over it,
// synced as level says.
func (f FS) writeFileAt(dir *os.File, name string, data []byte, perm fs.FileMode, level writeSync) (err error) {
	if err := checkName("write", name); err != nil {
		return err
	}
	path := filepath.Join(dir.Name(), name)
	if st, err := LstatAt(dir, name); err == nil && !st.IsRegular() {
		return &os.PathError{Op: "write", Path: path, Err: fmt.Errorf("%w: its type is %v", ErrNotRegular, st.Mode.Type())}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}

	tmp := TempName(name)
	file, err := f.OpenFileAt(dir, tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if err != nil && !renamed {
			_ = f.UnlinkAt(dir, tmp)
		}
	}()
	// The umask must not decide who may read a record: set the mode exactly.
	if err := file.Chmod(perm.Perm()); err != nil {
		file.Close()
		return err
	}
	if err := f.write(dir, tmp, file, data); err != nil {
		file.Close()
		return err
	}
	if level >= syncContent {
		if err := f.sync(dir, tmp, file); err != nil {
			file.Close()
			return err
		}
	}
	if err := file.Close(); err != nil {
		return err
	}
	if err := f.fault(OpRename, dir, name); err != nil {
		return err
	}
	err = control(dir, func(fd int) error {
		return IgnoringEINTR(func() error { return unix.Renameat(fd, tmp, fd, name) })
	})
	if err != nil {
		return &os.LinkError{Op: "rename", Old: filepath.Join(dir.Name(), tmp), New: path, Err: err}
	}
	renamed = true
	if level < syncName {
		return nil
	}
	// A failed directory sync must be reported: without it the new content may not survive a
	// crash.
	if serr := f.SyncDir(dir); serr != nil {
		return fmt.Errorf("the write of %s may not survive a crash: %w", path, serr)
	}
	return nil
}

// RenameNoReplaceAt renames the entry old in dir to new in the same directory, failing (with
// an error that matches fs.ErrExist) if new exists. A rename needs no space, which is why
// the stores move things aside by renaming where a full disk must not stop them. On a file
// system without RENAME_NOREPLACE it checks that new is missing and renames, which is
// exclusive only among callers that hold a common lock (the stores' callers do).
func (f FS) RenameNoReplaceAt(dir *os.File, old, new string) error {
	return f.MoveNoReplaceAt(dir, old, dir, new)
}

// MoveNoReplaceAt is [FS.RenameNoReplaceAt] from the directory from to the directory to, which
// must be on the same file system (else the error matches [unix.EXDEV]).
func (f FS) MoveNoReplaceAt(from *os.File, old string, to *os.File, new string) error {
	if err := checkName("rename", old); err != nil {
		return err
	}
	if err := checkName("rename", new); err != nil {
		return err
	}
	if err := f.fault(OpRename, to, new); err != nil {
		return err
	}
	err := control(from, func(fromFD int) error {
		return control(to, func(toFD int) error {
			err := IgnoringEINTR(func() error { return unix.Renameat2(fromFD, old, toFD, new, unix.RENAME_NOREPLACE) })
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
				var st unix.Stat_t
				if serr := unix.Fstatat(toFD, new, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil {
					return unix.EEXIST
				}
				err = IgnoringEINTR(func() error { return unix.Renameat(fromFD, old, toFD, new) })
			}
			return err
		})
	})
	if err != nil {
		return &os.LinkError{Op: "rename", Old: filepath.Join(from.Name(), old), New: filepath.Join(to.Name(), new), Err: err}
	}
	return nil
}

// RemoveAllAt is [RemoveTreeAt] through f: every unlink and rmdir of the walk asks f.Fault
// first; on an error the removal stops there, leaving what it did not reach.
func (f FS) RemoveAllAt(dir *os.File, name string) error {
	if err := checkName("remove", name); err != nil {
		return err
	}
	p := NewDirPath(dir)
	defer p.Close()
	return p.removeTree(f, name)
}
