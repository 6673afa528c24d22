package handlers

import (
	"context"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// ExecCommand runs a command to completion and returns its output. The workload belongs to
// the request: if the client goes away, nobody can read the result, so the workload is
// killed.
func (h *Handlers) ExecCommand(ctx context.Context, req openapi.ExecCommandRequestObject) (openapi.ExecCommandResponseObject, error) {
	b := req.Body
	wait := defaultExecWait
	if b.WaitMs != nil {
		wait = time.Duration(*b.WaitMs) * time.Millisecond
	}
	if err := checkProgram(b.Command); err != nil {
		return nil, err
	}
	ereq := execRequest(b)
	umask, err := parseUmask(b.Umask)
	if err != nil {
		return nil, err
	}
	ereq.Umask = umask
	release, err := h.bounds.admitExec()
	if err != nil {
		return nil, err
	}
	defer release()
	admission, err := h.sup.AdmitExec(ctx, req.ID, wait)
	if err != nil {
		return nil, err
	}
	defer admission.Release()

	start := time.Now()
	var stdin io.Reader
	if b.Stdin != nil {
		stdin = strings.NewReader(*b.Stdin)
	}
	res, err := h.sup.RunExec(ctx, admission, ereq, stdin)
	h.execDone("buffered", start, err == nil && res.TimedOut, err)
	if err != nil {
		return nil, cwdFault(err)
	}
	out := openapi.ExecResult{
		ExitCode:        res.ExitCode,
		TimedOut:        res.TimedOut,
		OomKilled:       &res.OOM,
		Stdout:          res.Stdout,
		Stderr:          res.Stderr,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		DurationMs:      time.Since(start).Milliseconds(),
		Signal:          signalName(res.ExitStatus),
	}
	return openapi.ExecCommand200JSONResponse(out), nil
}

// cwdFault names `cwd` as the field at fault when the sandbox's files refused the command's
// working directory: it does not exist (file-not-found), is not a directory, or the user may
// not enter it. A command that is missing or not executable is no refusal: it exits 127 or
// 126, as a shell answers it.
func cwdFault(err error) error {
	return faultAt(err, "cwd", errcode.FileNotFound)
}

// checkProgram refuses a command whose program is empty (`[""]`), naming the field: the
// schema can bound each argument but not single out the first, and the agent's own refusal
// would come back without a field.
func checkProgram(command []string) error {
	if len(command) > 0 && command[0] == "" {
		return errcode.Invalid("command", "The command's first element, the program, is empty; name a program (for example \"sh\").")
	}
	return nil
}

// execRequest is the workload of a buffered exec, with the contract's defaults.
func execRequest(b *openapi.ExecRequest) supervisor.ExecRequest {
	req := supervisor.ExecRequest{Argv: b.Command, Timeout: defaultExecTimeout}
	if b.Env != nil {
		req.Env = *b.Env
	}
	if b.Cwd != nil {
		req.Cwd = *b.Cwd
	}
	if b.User != nil {
		req.User = string(*b.User)
	}
	if b.TimeoutMs != nil {
		req.Timeout = time.Duration(*b.TimeoutMs) * time.Millisecond
	}
	return req
}

// parseUmask reads the contract's umask, an octal string ("0077"), into a mask; nil stays
// nil, the agent's default. The validator has checked the pattern already; parsing again
// keeps a handler called without it from running a mask nobody asked for.
func parseUmask(s *string) (*uint32, error) {
	if s == nil {
		return nil, nil
	}
	m, err := strconv.ParseUint(*s, 8, 32)
	if err != nil || m > 0o777 {
		return nil, errcode.Invalid("umask", "The umask %q is not an octal mask of three digits such as \"022\" or \"0077\".", *s)
	}
	mask := uint32(m)
	return &mask, nil
}

// signalName is the contract's name of the signal that ended a workload ("SIGKILL"), or nil.
func signalName(st supervisor.ExitStatus) *string {
	if st.Signal == "" {
		return nil
	}
	sig := "SIG" + st.Signal
	return &sig
}
