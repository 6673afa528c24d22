package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPackagedRuntime: without a runtime binary beside bothyd, the one the packages install
// in /usr/libexec/bothy is found, and one writable by others is refused, as beside bothyd.
func TestPackagedRuntime(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(self), runtimeBinaryName)); err == nil {
		t.Skip("a bothyd-runtime beside the test binary comes first")
	}
	exe := filepath.Join(t.TempDir(), runtimeBinaryName)
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	old := packagedRuntime
	packagedRuntime = exe
	t.Cleanup(func() { packagedRuntime = old })
	got, err := runtimeExecutable("", t.TempDir(), discard)
	if err != nil || got != exe {
		t.Fatalf("runtimeExecutable = %q, %v; want %q", got, err, exe)
	}
	if err := os.Chmod(exe, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := runtimeExecutable("", t.TempDir(), discard); err == nil {
		t.Fatal("a packaged runtime binary writable by others was taken")
	}
}
