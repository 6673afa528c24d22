//go:build linux && !amd64 && !arm64

package platform

// seccompSyscalls is empty on architectures sandboxd has no table for: DefaultSeccomp then
// fails with a clear error instead of running sandboxes without a filter.
var seccompSyscalls = [...]seccompSyscall{}
