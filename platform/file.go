package platform

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrNotRegular is wrapped by every error that refuses a file because it is not a regular file:
// a symbolic link (never followed), a FIFO, a socket, a device or a directory. Callers that
// protect a named file (a lock, a record) test for it with errors.Is.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is wrapped by the error of a bounded read whose file is larger than the bound.
var ErrTooLarge = errors.New("file larger than allowed")

// FileID identifies a file on this host: its device and inode. Two opens, or an open and a
// directory entry, name the same file exactly when their FileIDs are equal.
type FileID struct {
	Dev uint64
	Ino uint64
}

// Stat is the part of a file's status that callers here need. It is filled without following a
// final symbolic link, so Mode tells a link apart from its target.
type Stat struct {
	ID    FileID
	Mode  fs.FileMode
	UID   uint32
	Nlink uint64
	Size  int64
}

// IsRegular reports whether the status is that of a regular file.
func (s Stat) IsRegular() bool { return s.Mode.IsRegular() }

// IsDir reports whether the status is that of a directory.
func (s Stat) IsDir() bool { return s.Mode.IsDir() }

// EnsureDir creates dir/name with perm, or accepts an existing directory that is not a link.
func EnsureDir(dir, name string, perm os.FileMode) error {
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, perm); err == nil {
		return os.Chmod(p, perm)
	} else if !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", p)
	}
	return os.Chmod(p, perm)
}

// FileSHA256 is the hex SHA-256 of the content of the file at path (an executable, a kernel
// image), for identities that must change when the file does.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
