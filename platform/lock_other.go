//go:build !linux

package platform

import "os"

// The stubs exist so that the module builds elsewhere; sandboxd's locks rely on Linux flock.

func TryLock(f *os.File) (bool, error) { return false, ErrUnsupported }
func LockShared(f *os.File) error      { return ErrUnsupported }
func Unlock(f *os.File) error          { return ErrUnsupported }
