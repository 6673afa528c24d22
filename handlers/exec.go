package handlers

import (
	"context"
	"io"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/openapi"
	"github.com/sandboxd/sandboxd/supervisor"
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
	res, err := h.sup.RunExec(ctx, admission, execRequest(b), stdin)
	h.execDone("buffered", start, err == nil && res.TimedOut, err)
	if err != nil {
		return nil, err
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
		req.User = *b.User
	}
	if b.TimeoutMs != nil {
		req.Timeout = time.Duration(*b.TimeoutMs) * time.Millisecond
	}
	return req
}

// signalName is the contract's name of the signal that ended a workload ("SIGKILL"), or nil.
func signalName(st supervisor.ExitStatus) *string {
	if st.Signal == "" {
		return nil
	}
	sig := "SIG" + st.Signal
	return &sig
}
