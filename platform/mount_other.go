//go:build !linux

package platform

import "os"

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

func Mount(source, target, fstype string, flags uintptr, data string) error { return ErrUnsupported }
func MountDetached(fstype, source string, attrs int) (*os.File, error)      { return nil, ErrUnsupported }
func MakePrivate(target string) error                                       { return ErrUnsupported }
func BindReadOnly(source, target string) error                              { return ErrUnsupported }
func Bind(source, target string, flags uintptr) error                       { return ErrUnsupported }
func PivotRoot(newRoot string) error                                        { return ErrUnsupported }
func MountsUnder(dir string) ([]string, error)                              { return nil, ErrUnsupported }
func UnmountUnder(dir string) error                                         { return ErrUnsupported }
func MakeMountPoint(p string, dir bool) error                               { return ErrUnsupported }
