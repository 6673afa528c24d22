package errcode

import (
	"errors"
	"syscall"
)

// Exhausted returns err as an Unavailable error when the process ran out of a resource the
// kernel rations rather than the request asked too much of: descriptors (EMFILE for the
// process, ENFILE for the host) or processes (EAGAIN, which fork and clone return at
// RLIMIT_NPROC, a pids controller's limit or the host's threads-max). The condition passes by
// itself as streams close and processes end, so the caller is told to retry; it is not the
// server's bug, so it is not a 500. An error without one of those errnos, or that already
// carries a code other than Internal, is returned as it is.
func Exhausted(err error) error {
	if err == nil {
		return nil
	}
	if c := Of(err); c != "" && c != Internal {
		return err
	}
	switch {
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return Wrap(Unavailable, err,
			"The server has run out of file descriptors; retry shortly, close streams you no longer need, and if it persists ask the operator to raise bothyd's RLIMIT_NOFILE.")
	case errors.Is(err, syscall.EAGAIN):
		return Wrap(Unavailable, err,
			"The server cannot start another process right now (the host's process or thread limit); retry shortly, and if it persists ask the operator to raise the limit.")
	}
	return err
}
