//go:build !linux

package template

import (
	"context"
	"os"

	"github.com/bothy/bothy/platform"
)

// CopyLayer needs Linux's system calls (see copy_other.go).
func CopyLayer(ctx context.Context, src, dst *os.File, name string) (int64, error) {
	return 0, platform.ErrUnsupported
}

// LayerSize needs Linux's system calls (see copy_other.go).
func LayerSize(dir *os.File) (int64, error) { return 0, platform.ErrUnsupported }

// MergeLayers needs Linux's system calls (see copy_other.go).
func MergeLayers(ctx context.Context, layers []*os.File, dst *os.File, name string) (int64, error) {
	return 0, platform.ErrUnsupported
}
