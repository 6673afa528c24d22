//go:build !linux

package checkpoint

import "github.com/bothy/bothy/platform"

// LinkLayer needs Linux's xattr calls to carry overlayfs's marks; this twin exists so that
// the module builds elsewhere.
func LinkLayer(src, dst string) error { return platform.ErrUnsupported }
