//go:build !linux

package platform

import (
	"io/fs"
	"os"
)

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

func OpenInRoot(root *os.File, p string, flags int) (*os.File, error) { return nil, ErrUnsupported }
func MkdirAllInRoot(root *os.File, p string, perm fs.FileMode) (*os.File, error) {
	return nil, ErrUnsupported
}
func MakeFileInRoot(root *os.File, p string, perm fs.FileMode) (*os.File, error) {
	return nil, ErrUnsupported
}
func SymlinkInRoot(root *os.File, p, target string) error { return ErrUnsupported }
