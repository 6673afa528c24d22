//go:build !linux

package platform

import (
	"io/fs"
	"os"
)

// These stubs exist so that the module builds elsewhere; the stores' file operations rely on
// Linux *at calls and their no-follow semantics.

func (f FS) WriteFileDurableAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return ErrUnsupported
}
func (f FS) WriteFileWholeAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return ErrUnsupported
}
func (f FS) WriteFileAtomicAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return ErrUnsupported
}

func (f FS) RenameNoReplaceAt(dir *os.File, old, new string) error { return ErrUnsupported }

func (f FS) MoveNoReplaceAt(from *os.File, old string, to *os.File, new string) error {
	return ErrUnsupported
}

func (f FS) RemoveAllAt(dir *os.File, name string) error { return ErrUnsupported }
