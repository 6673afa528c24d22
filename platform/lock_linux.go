//go:build linux

package platform

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// TryLock tries once, without blocking, to take an exclusive flock(2) on f. It reports false
// and no error when another open file description holds the lock. flock locks belong to the
// open file description, so two opens of one file exclude each other also within one process,
// and the lock ends when the last descriptor of that description is closed (also when the
// process dies), which is what lets a crashed holder never wedge a lock.
func TryLock(f *os.File) (bool, error) {
	switch err := flock(f, unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		return false, nil
	default:
		return false, err
	}
}

// LockShared takes a shared flock(2) on f, waiting while another open file description holds
// it exclusively (see TryLock for what the lock belongs to and when it ends).
func LockShared(f *os.File) error { return flock(f, unix.LOCK_SH) }

// ErrLockHeld says a lock stayed held by another open file description for as long as
// [LockWithin] waited.
var ErrLockHeld = errors.New("platform: the lock stayed held")

// LockWithin takes a flock(2) on f, exclusive or shared, waiting up to d while another open
// file description holds it (see TryLock for what the lock belongs to and when it ends). It
// tries again after growing pauses ([Poll], up to 20 ms) rather than blocking in flock, so
// that the wait is bounded; once d has passed it returns an error that wraps ErrLockHeld.
// waiting, unless nil, is called once, before the first pause.
func LockWithin(f *os.File, exclusive bool, d time.Duration, waiting func()) error {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	locked, err := Poll(d, 20*time.Millisecond, waiting, func() (bool, error) {
		err := flock(f, how|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return err == nil, err
	})
	if err == nil && !locked {
		err = &os.PathError{Op: "flock", Path: f.Name(), Err: ErrLockHeld}
	}
	return err
}

// Unlock releases a flock taken with TryLock or LockShared. Closing f releases it as well.
func Unlock(f *os.File) error { return flock(f, unix.LOCK_UN) }

// flock runs flock(2) with how on f, waiting if how does, and names f in its error.
func flock(f *os.File, how int) error {
	err := control(f, func(fd int) error {
		return IgnoringEINTR(func() error { return unix.Flock(fd, how) })
	})
	if err != nil {
		return &os.PathError{Op: "flock", Path: f.Name(), Err: err}
	}
	return nil
}
