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

// WriteFileDurable is WriteFileDurableAt for the directory at dir (a final component that is
// a link is refused).
func WriteFileDurable(dir, name string, data []byte, perm fs.FileMode) error {
	d, err := OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return WriteFileDurableAt(d, name, data, perm)
}

// WriteFileDurableAt replaces the file name in dir with data, atomically and durably: readers
// see the old content or the new, never a mix, and once it returns nil the new content
// survives a crash. It refuses (wrapping ErrNotRegular) a target that exists and is not a
// regular file, leaving it untouched. The data goes to a temporary file of the form TempName
// gives, in dir itself so that the rename cannot cross file systems; that file is created
// exclusively with exactly perm, written, fsynced, closed and renamed over name, and then dir
// is fsynced. On failure the temporary file is removed.
func WriteFileDurableAt(dir *os.File, name string, data []byte, perm fs.FileMode) (err error) {
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
	f, err := OpenFileAt(dir, tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if err != nil && !renamed {
			_ = UnlinkAt(dir, tmp)
		}
	}()
	// The umask must not decide who may read a record: set the mode exactly.
	if err := f.Chmod(perm.Perm()); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	err = control(dir, func(fd int) error {
		return ignoringEINTR(func() error { return unix.Renameat(fd, tmp, fd, name) })
	})
	if err != nil {
		return &os.LinkError{Op: "rename", Old: filepath.Join(dir.Name(), tmp), New: path, Err: err}
	}
	renamed = true
	// A failed directory sync must be reported: without it the new content may not survive a
	// crash.
	if serr := SyncDir(dir); serr != nil {
		return fmt.Errorf("the write of %s may not survive a crash: %w", path, serr)
	}
	return nil
}
