//go:build linux && !amd64 && !arm64

package seccomp

// syscallTable is empty on architectures bothyd has no table for: [Default] then
// fails with a clear error instead of running sandboxes without a filter.
var syscallTable = [...]syscallEntry{}
