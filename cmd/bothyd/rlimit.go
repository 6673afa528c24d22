//go:build unix

package main

import (
	"log/slog"
	"syscall"
)

// raiseNoFile raises bothyd's soft RLIMIT_NOFILE to its hard limit, the most the host lets
// it have without privilege, and logs the result: every sandbox costs the server descriptors
// (a control socket, streams, file transfers), and the usual soft limit of 1024 would run
// out long before the host does. It returns the soft limit in force.
//
// The Go runtime (1.19 on) already raises the soft limit at start-up and puts the old one
// back for the processes it starts, so that sandboxes keep the host's usual limit; this makes
// sure of the raise whatever the runtime did, and puts the value in force in the log, where
// an operator looking at "too many open files" looks first.
func raiseNoFile(log *slog.Logger) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("reading RLIMIT_NOFILE", "err", err)
		return 0
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = raised.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			log.Warn("raising RLIMIT_NOFILE to its hard limit", "soft", lim.Cur, "hard", lim.Max, "err", err)
			return lim.Cur
		}
		lim = raised
	}
	log.Info("descriptor limit", "rlimit_nofile", lim.Cur)
	return lim.Cur
}
