//go:build !linux

package platform

import (
	"errors"
	"syscall"
)

// These stubs exist so that the module builds on other systems; bothyd runs only on Linux.

// ErrProcessGone means the process named by a ProcessID no longer runs.
var ErrProcessGone = errors.New("platform: process is gone")

// Identify is unsupported off Linux.
func Identify(pid int) (ProcessID, error) { return ProcessID{}, ErrUnsupported }

// ParentPid is unsupported off Linux.
func ParentPid(pid int) (int, error) { return 0, ErrUnsupported }

// Alive is always false off Linux.
func (p ProcessID) Alive() bool { return false }

// SignalVerified is unsupported off Linux.
func SignalVerified(p ProcessID, sig syscall.Signal) error { return ErrUnsupported }

// Children is unsupported off Linux.
func Children(pid int) ([]int, error) { return nil, ErrUnsupported }

// SignalChildren is unsupported off Linux.
func SignalChildren(parent ProcessID, sig syscall.Signal) (int, error) { return 0, ErrUnsupported }

func SignalChildrenExcept(parent ProcessID, sig syscall.Signal, skip func(pid int) bool) (int, error) {
	return 0, ErrUnsupported
}

// SetOOMScoreAdj is unsupported off Linux.
func SetOOMScoreAdj(pid, score int) error { return ErrUnsupported }
