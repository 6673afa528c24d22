//go:build !linux

package image

import (
	"io"
	"os"

	"github.com/bothy/bothy/platform"
)

// The stubs exist so that the module builds elsewhere; unpacking a layer safely relies on
// Linux's openat2 and on overlay whiteouts, which only Linux has.

func unpackTar(r io.Reader, fsDir *os.File, limits Limits) (UnpackStats, error) {
	return UnpackStats{}, platform.ErrUnsupported
}

func renameNoReplace(dir *os.File, old, new string) error { return platform.ErrUnsupported }
