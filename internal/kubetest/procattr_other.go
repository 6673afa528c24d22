//go:build !linux

package kubetest

import "syscall"

// diesWithParent is nothing off Linux, which has no parent-death signal: the cleanup stops
// the child.
func diesWithParent() *syscall.SysProcAttr { return nil }
