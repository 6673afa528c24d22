//go:build !linux

package platform

import (
	"io/fs"
	"os"
)

// These stubs exist so that the module builds on other systems (for editing and for testing
// the pure parts); bothyd relies on Linux semantics (flock, O_NOFOLLOW, *at calls), so every
// primitive reports ErrUnsupported rather than approximating them.

func StatOf(f *os.File) (Stat, error)                                    { return Stat{}, ErrUnsupported }
func IDOf(f *os.File) (FileID, error)                                    { return FileID{}, ErrUnsupported }
func LstatAt(dir *os.File, name string) (Stat, error)                    { return Stat{}, ErrUnsupported }
func OpenDir(path string) (*os.File, error)                              { return nil, ErrUnsupported }
func OpenDirAt(dir *os.File, name string) (*os.File, error)              { return nil, ErrUnsupported }
func MkdirAt(dir *os.File, name string, perm fs.FileMode) error          { return ErrUnsupported }
func OpenFile(path string, flag int, perm fs.FileMode) (*os.File, error) { return nil, ErrUnsupported }
func ReadFileAt(dir *os.File, name string, max int64) ([]byte, error)    { return nil, ErrUnsupported }
func ReadFile(path string, max int64) ([]byte, error)                    { return nil, ErrUnsupported }
func ListDir(path string) ([]string, error)                              { return nil, ErrUnsupported }
func ReadDirNames(dir *os.File) ([]string, error)                        { return nil, ErrUnsupported }
func UnlinkAt(dir *os.File, name string) error                           { return ErrUnsupported }
func RmdirAt(dir *os.File, name string) error                            { return ErrUnsupported }
func SyncDir(dir *os.File) error                                         { return ErrUnsupported }
func SyncDirPath(path string) error                                      { return ErrUnsupported }

func OpenFileAt(dir *os.File, name string, flag int, perm fs.FileMode) (*os.File, error) {
	return nil, ErrUnsupported
}

// GrowPipe does nothing here: the pipe keeps its size.
func GrowPipe(f *os.File, size int) {}

// SetCloseOnExec is Linux's alone.
func SetCloseOnExec(f *os.File, on bool) error { return ErrUnsupported }
