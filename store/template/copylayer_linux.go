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

// MergeLayers makes in a new directory name under dst the merge of layers (overlayfs
// layers, bottom first) as overlayfs shows them, whiteouts kept (as a clone's capture is
// flattened), fsyncing everything, and returns the bytes of regular files in the result.
func MergeLayers(ctx context.Context, layers []*os.File, dst *os.File, name string) (int64, error) {
	c := &copier{ctx: ctx, links: map[inode]string{}, dstRoot: dst.Name(), euid: os.Geteuid(), egid: os.Getegid()}
	size, err := c.copyRoot(layers[0], dst, name)
	if err != nil || len(layers) == 1 {
		return size, err
	}
	for _, l := range layers[1:] {
		if _, err := c.mergeRoot(l, dst, name); err != nil {
			return 0, err
		}
	}
	merged, err := openDirAt(dst, name)
	if err != nil {
		return 0, err
	}
	defer merged.Close()
	return sizeTree(merged, map[inode]bool{})
}

// LayerSize sums the sizes of the regular files under the layer dir, each inode once.
func LayerSize(dir *os.File) (int64, error) {
	return sizeTree(dir, map[inode]bool{})
}
