//go:build !linux

package platform

import (
	"io/fs"
	"os"
)

// The stubs exist so that the module builds elsewhere; durable writes here rely on Linux *at
// calls and their no-follow semantics.

func WriteFileDurable(dir, name string, data []byte, perm fs.FileMode) error { return ErrUnsupported }
func WriteFileDurableAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return ErrUnsupported
}
func WriteFileWholeAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return ErrUnsupported
}
func WriteFileAtomic(dir, name string, data []byte, perm fs.FileMode) error { return ErrUnsupported }
func WriteFileAtomicAt(dir *os.File, name string, data []byte, perm fs.FileMode) error {
	return ErrUnsupported
}
