//go:build !linux

package seccomp

import "github.com/bothy/bothy/platform"

// Default is unsupported off Linux; this stub exists so that the module builds on other
// systems, and bothyd runs only on Linux.
func Default(caps []string) (*platform.SeccompProgram, error) { return nil, platform.ErrUnsupported }

// DefaultWithClone3 is unsupported off Linux, as Default is.
func DefaultWithClone3(caps []string) (*platform.SeccompProgram, error) {
	return nil, platform.ErrUnsupported
}
