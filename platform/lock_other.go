//go:build !linux

package platform

import (
	"errors"
	"os"
	"time"
)

// The stubs exist so that the module builds elsewhere; bothyd's locks rely on Linux flock.

func TryLock(f *os.File) (bool, error) { return false, ErrUnsupported }
func LockShared(f *os.File) error      { return ErrUnsupported }
func Unlock(f *os.File) error          { return ErrUnsupported }

var ErrLockHeld = errors.New("platform: the lock stayed held")

func LockWithin(f *os.File, exclusive bool, d time.Duration, waiting func()) error {
	return ErrUnsupported
}
