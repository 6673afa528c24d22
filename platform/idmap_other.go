//go:build !linux

package platform

import (
	"errors"
	"os"
)

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

var ErrIDMapUnsupported = errors.New("the file system does not support idmapped mounts")

func SetMountIDMap(m, userns *os.File, recursive bool) error { return ErrUnsupported }
func AsThreadUser(uid, gid int, fn func() error) error       { return ErrUnsupported }

type IDRangeLock struct{}

func OpenIDRangeLock(path string) (*IDRangeLock, error) { return nil, ErrUnsupported }
func (l *IDRangeLock) TryLock(n int) (bool, error)      { return false, ErrUnsupported }
func (l *IDRangeLock) Held(n int) (bool, error)         { return false, ErrUnsupported }
func (l *IDRangeLock) Close() error                     { return nil }
func (l *IDRangeLock) KeepOnExec(keep bool) error       { return ErrUnsupported }
