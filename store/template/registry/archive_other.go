//go:build !linux

package registry

import (
	"errors"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The archive of a generation reads and writes ownership, devices and xattrs with Linux's
// *at calls and openat2; elsewhere bothyd runs no sandboxes, so it moves no generations.
var errUnsupported = errors.New("registry: moving template generations is supported on Linux only")

func writeArchive(io.Writer, *os.File, *blobIndex) error { return errUnsupported }

func extractArchive(io.Reader, *os.File, Limits, map[v1.Hash]v1.Descriptor, func(v1.Descriptor) (blobReader, error)) (int64, error) {
	return 0, errUnsupported
}
