package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/sandboxd/sandboxd/runtime/namespace"
)

// runtimeBinaryName is the optional binary of the sandbox side (cmd/sandboxd-runtime).
const runtimeBinaryName = "sandboxd-runtime"

// newRuntime returns the runtime as the server configures it, running the runtime binary
// that runtimeExecutable chooses for binary (the --runtime-binary flag), and that
// executable. `sandboxd check` makes its runtime here too: a runtime's identity hashes its
// executable and configuration, so a checker configured otherwise than the server would take
// every running sandbox for one of another runtime.
func newRuntime(binary string) (*namespace.Runtime, string, error) {
	exe, err := runtimeExecutable(binary)
	if err != nil {
		return nil, "", err
	}
	rt, err := namespace.New(namespace.Config{Executable: exe})
	if err != nil {
		return nil, "", err
	}
	return rt, exe, nil
}

// runtimeExecutable chooses what sandboxes run as their shim, init and agent: the binary
// given, else sandboxd-runtime beside this executable, else this executable itself ("" lets
// the runtime use /proc/self/exe). The smaller binary starts sandboxes faster; see
// cmd/sandboxd-runtime. Because it runs as root, it must belong to the user sandboxd runs as
// (or root) and be writable by no one else.
func runtimeExecutable(given string) (string, error) {
	if given != "" {
		abs, err := filepath.Abs(given)
		if err != nil {
			return "", err
		}
		if err := checkRuntimeBinary(abs); err != nil {
			return "", err
		}
		return abs, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", nil
	}
	beside := filepath.Join(filepath.Dir(self), runtimeBinaryName)
	if _, err := os.Lstat(beside); errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err := checkRuntimeBinary(beside); err != nil {
		return "", err
	}
	return beside, nil
}

func checkRuntimeBinary(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("the runtime binary: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("the runtime binary %s is not a regular file", path)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("the runtime binary %s is not executable", path)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("the runtime binary %s is writable by others; chmod go-w it", path)
	case ok && int(st.Uid) != os.Geteuid() && st.Uid != 0:
		return fmt.Errorf("the runtime binary %s belongs to another user", path)
	}
	return nil
}
