//go:build linux

package platform

import (
	"io/fs"
	"os"
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
func WriteFileDurableAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return FS{}.WriteFileDurableAt(dir, name, data, perm)
}

// WriteFileWholeAt is WriteFileDurableAt without the directory's fsync: readers see the old
// content or the new, never a mix, and after a crash of the host the file holds the old
// content (or, if it had none, is absent) or the new, whole: the new content is synced before
// the rename, so the rename never leaves an empty or torn file, but the rename itself may be
// undone. For a record whose older version, or whose absence, is as good after a reboot; a
// later fsync of dir (a durable write or removal in it) makes the rename durable too.
func WriteFileWholeAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return FS{}.WriteFileWholeAt(dir, name, data, perm)
}

// WriteFileAtomic is WriteFileAtomicAt for the directory at dir (a final component that is a
// link is refused).
func WriteFileAtomic(dir, name string, data []byte, perm fs.FileMode) error {
	d, err := OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return WriteFileAtomicAt(d, name, data, perm)
}

// WriteFileAtomicAt is WriteFileDurableAt without its two fsyncs: readers see the old content
// or the new, never a mix, and a crash of the process changes nothing of that (the page cache
// keeps both writes), but after a crash of the host the file may hold the old content, the
// new, or nothing. For what is worthless after a reboot: the callers say why theirs is.
func WriteFileAtomicAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return FS{}.WriteFileAtomicAt(dir, name, data, perm)
}
