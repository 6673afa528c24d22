//go:build linux

package template

import (
	"context"
	"os"
)

// CopyLayer copies the overlayfs layer src (whiteouts, opaque directories, owners, modes,
// times and hard links kept; file data by copy_file_range, which reflinks where the file
// system can) into a new directory name under dst, fsyncing every file and directory, and
// returns the bytes of regular files copied. It is the template store's own layer copy,
// exported for the checkpoints of a running sandbox (package checkpoint).
func CopyLayer(ctx context.Context, src, dst *os.File, name string) (int64, error) {
	c := &copier{ctx: ctx, links: map[inode]string{}, dstRoot: dst.Name(), euid: os.Geteuid(), egid: os.Getegid()}
	return c.copyRoot(src, dst, name)
}

// LayerSize sums the sizes of the regular files under the layer dir, each inode once.
func LayerSize(dir *os.File) (int64, error) {
	return sizeTree(dir, map[inode]bool{})
}
