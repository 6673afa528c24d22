//go:build !linux

package seccomp

import "github.com/sandboxd/sandboxd/platform"

// Default is unsupported off Linux; this stub exists so that the module builds on other
// systems, and sandboxd runs only on Linux.
func Default(caps []string) (*platform.SeccompProgram, error) { return nil, platform.ErrUnsupported }
