//go:build !linux

package platform

import "os"

const LoopControl = "/dev/loop-control"

func AttachLoop(image string) (*os.File, error)    { return nil, ErrUnsupported }
func AttachLoopFile(f *os.File) (*os.File, error)  { return nil, ErrUnsupported }
func LoopBackingFiles() (map[string]string, error) { return nil, ErrUnsupported }
func OpenForWriting(f *os.File) (bool, error)      { return false, ErrUnsupported }
