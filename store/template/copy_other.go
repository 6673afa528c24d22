//go:build !linux

package template

import (
	"context"
	"os"

	"github.com/bothy/bothy/platform"
)

// The template store copies layers with Linux system calls (mknodat for overlayfs whiteouts,
// the xattr calls for opaque directories); this twin exists so that the module builds
// elsewhere, and every operation that needs those calls fails with platform.ErrUnsupported.

type inode struct{ dev, ino uint64 }

type copier struct {
	ctx      context.Context
	progress func(copied, total int64)
	total    int64
	copied   int64
	links    map[inode]string
	dstRoot  string
	euid     int
	egid     int
	buf      []byte
}

func sizeTree(dir *os.File, seen map[inode]bool) (int64, error) { return 0, platform.ErrUnsupported }

func (c *copier) copyRoot(src, dst *os.File, name string) (int64, error) {
	return 0, platform.ErrUnsupported
}

func (c *copier) mergeRoot(src, dst *os.File, name string) (int64, error) {
	return 0, platform.ErrUnsupported
}

func openDirAt(dir *os.File, name string) (*os.File, error) { return nil, platform.ErrUnsupported }
