package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Go crash of the agent (here the one a too-small pids limit caused) leaves its goroutine
// dump in the sandbox log; the start-timeout detail, which quotes the log's end, keeps the
// human lines of it and none of the frames.
func TestLogTailLeavesOutGoTracebacks(t *testing.T) {
	t.Parallel()
	const log = `2026-12-01T13:37:38.913108133Z bothyd shim: user namespace: ids 0-65535 are host ids 1879048192-1879113727 (slot 0)
2026/12/01 13:38:02 INFO agent listening hostname=p6 pid=1
runtime: failed to create new OS thread (have 8 already; errno=11)
runtime: may need to increase max user processes (ulimit -u)
fatal error: newosproc

runtime stack:
runtime.throw({0x607cb9?, 0x312aec621e80?})
	/usr/local/go/src/runtime/panic.go:1229 +0x48 fp=0x312aec621e58 sp=0x312aec621e28 pc=0x483608
runtime.newosproc(0x312aec60b808)
	/usr/local/go/src/runtime/os_linux.go:199 +0x165 fp=0x312aec621ec8 sp=0x312aec621e58 pc=0x448845

goroutine 1 [running]:
main.main()
	/src/cmd/bothyd/main.go:12 +0x1f
created by os/signal.Notify.func1.1 in goroutine 1
	/usr/local/go/src/os/signal/signal.go:152 +0x1f
2026-12-01T13:37:39.169484451Z bothyd shim: the sandbox ended: exited (exit code 2, signal "", oom false)
`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, LogName), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got := (&Supervisor{}).logTail(dir, 20)
	for _, frame := range []string{"goroutine", ".go:", "+0x", "runtime.throw", "main.main", "created by", "runtime stack"} {
		if strings.Contains(got, frame) {
			t.Errorf("the tail has %q of a Go traceback:\n%s", frame, got)
		}
	}
	for _, human := range []string{"user namespace", "agent listening", "failed to create new OS thread", "fatal error: newosproc", "the sandbox ended"} {
		if !strings.Contains(got, human) {
			t.Errorf("the tail lost the line with %q:\n%s", human, got)
		}
	}
	if got := (&Supervisor{}).logTail(dir, 2); strings.Count(got, "\n") != 2 || !strings.Contains(got, "the sandbox ended") {
		t.Errorf("the last 2 human lines: %q", got)
	}
}
