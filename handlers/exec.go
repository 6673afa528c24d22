package handlers

import (
	"context"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/control"
	"github.com/sandboxd/sandboxd/errcode"
	"github.com/sandboxd/sandboxd/openapi"
)

// ExecCommand runs a command to completion and returns its output. The workload belongs to
// the request: if the client goes away, nobody can read the result, so the workload is
// killed (closing its control stream makes the agent kill it).
func (h *Handlers) ExecCommand(ctx context.Context, req openapi.ExecCommandRequestObject) (openapi.ExecCommandResponseObject, error) {
	b := req.Body
	wait := defaultExecWait
	if b.WaitMs != nil {
		wait = time.Duration(*b.WaitMs) * time.Millisecond
	}
	admission, err := h.sup.AdmitExec(ctx, req.ID, wait)
	if err != nil {
		return nil, err
	}
	defer admission.Release()

	creq := control.ExecRequest{
		Argv:      b.Command,
		TimeoutMS: defaultExecTimeout.Milliseconds(),
		Stdin:     b.Stdin != nil,
	}
	if b.Env != nil {
		creq.Env = *b.Env
	}
	if b.Cwd != nil {
		creq.Cwd = *b.Cwd
	}
	if b.User != nil {
		creq.User = *b.User
	}
	if b.TimeoutMs != nil {
		creq.TimeoutMS = int64(*b.TimeoutMs)
	}
	start := time.Now()
	proc, err := admission.Agent.Exec(ctx, creq)
	if err != nil {
		err = workloadLost(req.ID, admission.Agent, err)
		h.execDone("buffered", start, false, err)
		return nil, err
	}
	defer proc.Close()
	stop := context.AfterFunc(ctx, func() { proc.Close() })
	defer stop()

	if proc.Stdin != nil {
		go func() {
			_, _ = io.Copy(proc.Stdin, strings.NewReader(*b.Stdin))
			proc.Stdin.Close()
		}()
	}
	var stdout, stderr cappedBuffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(&stdout, proc.Stdout) }()
	go func() { defer wg.Done(); _, _ = io.Copy(&stderr, proc.Stderr) }()
	wg.Wait()
	status, err := proc.Wait()
	if err != nil {
		err = workloadLost(req.ID, admission.Agent, err)
	}
	h.execDone("buffered", start, err == nil && status.TimedOut, err)
	if err != nil {
		return nil, err
	}
	res := openapi.ExecResult{
		ExitCode:        status.ExitCode,
		TimedOut:        status.TimedOut,
		Stdout:          stdout.String(),
		Stderr:          stderr.String(),
		StdoutTruncated: stdout.truncated,
		StderrTruncated: stderr.truncated,
		DurationMs:      time.Since(start).Milliseconds(),
	}
	if status.Signal != "" {
		sig := "SIG" + status.Signal
		res.Signal = &sig
	}
	return openapi.ExecCommand200JSONResponse(res), nil
}

// cappedBuffer keeps the first maxExecOutput bytes written to it and discards the rest, so
// that a workload flooding its output cannot exhaust the server's memory, and is still read to
// the end so that it is not stalled.
type cappedBuffer struct {
	strings.Builder
	truncated bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := maxExecOutput - c.Len(); room < len(p) {
		c.truncated = true
		if room > 0 {
			c.Builder.Write(p[:room])
		}
		return len(p), nil
	}
	return c.Builder.Write(p)
}

// workloadLost explains a workload that ended without an exit status. When its control
// session is gone, the sandbox stopped (or its agent died) under it: that is the caller's
// answer, not a server fault.
func workloadLost(id string, agent *control.Client, err error) error {
	select {
	case <-agent.Done():
		return errcode.Wrap(errcode.NotRunning, err,
			"Sandbox %s stopped while the command ran, and the command ended with it; its output is lost.", id)
	default:
		return err
	}
}
