package kubetest

import "syscall"

// diesWithParent makes a child that the kernel kills when the test binary dies.
func diesWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
