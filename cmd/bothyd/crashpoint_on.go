//go:build crashpoints

package main

import (
	"os"
	"syscall"
)

// crashPoint, in a bothyd built with the crashpoints tag (the end-to-end crash tests build
// one), kills bothyd with SIGKILL at the supervisor's step named by BOTHYD_CRASH_AT, so that
// a test sees what a crash of the real server there leaves and how the next one recovers.
// Release builds have no such hook (crashpoint_off.go).
func crashPoint() func(string) {
	at := os.Getenv("BOTHYD_CRASH_AT")
	if at == "" {
		return nil
	}
	return func(step string) {
		if step == at {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // SIGKILL cannot be caught; wait for it to land
		}
	}
}
