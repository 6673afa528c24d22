//go:build !linux

package platform

import "os"

// The bounded tree walk relies on Linux's *at calls and O_NOFOLLOW; this stub exists so that
// the module builds elsewhere.

// RemoveTreeAt is unsupported on this OS.
func RemoveTreeAt(dir *os.File, name string) error { return ErrUnsupported }
