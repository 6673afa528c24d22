package handlers

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// TestExecRequest: a buffered exec maps onto the supervisor's workload, with the contract's
// defaults (timeout and wait of a minute) for what it leaves out.
func TestExecRequest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		body  string
		want  supervisor.ExecRequest
		wait  time.Duration
		stdin string
	}{
		{`{"command":["true"]}`, supervisor.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute}, time.Minute, ""},
		{
			`{"command":["sh","-c","cat"],"env":["A=1"],"cwd":"/tmp","user":"root","timeout_ms":1500,"wait_ms":20,"stdin":"hi"}`,
			supervisor.ExecRequest{Argv: []string{"sh", "-c", "cat"}, Env: []string{"A=1"}, Cwd: "/tmp", User: "root", Timeout: 1500 * time.Millisecond},
			20 * time.Millisecond, "hi",
		},
	}
	for _, tc := range cases {
		f := &fakeSupervisor{runResult: &supervisor.ExecResult{}}
		h, _ := newTestHandlers(t, f)
		code, body := do(t, newTestServer(t, h), "POST", "/v1/sandboxes/a1/exec", tc.body)
		if code != http.StatusOK || len(f.runs) != 1 {
			t.Fatalf("%s: %d %s, %d runs", tc.body, code, body, len(f.runs))
		}
		if f.admitted[0] != (admitCall{"a1", tc.wait}) {
			t.Errorf("%s: admitted %+v, want wait %v", tc.body, f.admitted[0], tc.wait)
		}
		if run := f.runs[0]; !equalExec(run.req, tc.want) || run.stdin != tc.stdin {
			t.Errorf("%s: ran %+v with stdin %q, want %+v with %q", tc.body, run.req, run.stdin, tc.want, tc.stdin)
		}
	}
}

// TestExecResult: the workload's outcome reads as the contract's result, and is reported to
// the exec metrics.
func TestExecResult(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{runResult: &supervisor.ExecResult{
		ExitStatus: supervisor.ExitStatus{ExitCode: 137, Signal: "KILL", TimedOut: true},
		Stdout:     "out", Stderr: "err", StdoutTruncated: true,
	}}
	h, execs := newTestHandlers(t, f)
	code, body := do(t, newTestServer(t, h), "POST", "/v1/sandboxes/a1/exec", `{"command":["sleep","9"]}`)
	var res openapi.ExecResult
	if err := json.Unmarshal(body, &res); err != nil || code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if res.ExitCode != 137 || res.Signal == nil || *res.Signal != "SIGKILL" || !res.TimedOut ||
		res.Stdout != "out" || res.Stderr != "err" || !res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("result %+v", res)
	}
	if !slices.Equal(*execs, []string{"buffered  timed-out"}) {
		t.Errorf("execs reported %q", *execs)
	}
}

// TestExecRefusals: an exec that is not admitted is the supervisor's answer and no exec of
// the metrics; one whose workload is lost is.
func TestExecRefusals(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{admitErr: errcode.New(errcode.SandboxBusy, "Another exec is running.")}
	h, execs := newTestHandlers(t, f)
	s := newTestServer(t, h)
	code, body := do(t, s, "POST", "/v1/sandboxes/a1/exec", `{"command":["true"]}`)
	if p := problemOf(t, body); code != http.StatusLocked || p.Code != string(errcode.SandboxBusy) {
		t.Errorf("busy: %d %+v", code, p)
	}
	if len(f.runs) != 0 || len(*execs) != 0 {
		t.Errorf("not admitted, but %d runs and execs %q", len(f.runs), *execs)
	}

	f.admitErr = nil
	f.runErr = errcode.New(errcode.NotRunning, "Sandbox a1 stopped while the command ran.")
	code, body = do(t, s, "POST", "/v1/sandboxes/a1/exec", `{"command":["true"]}`)
	if p := problemOf(t, body); code != http.StatusConflict || p.Code != string(errcode.NotRunning) {
		t.Errorf("lost: %d %+v", code, p)
	}
	if !slices.Equal(*execs, []string{"buffered not-running"}) {
		t.Errorf("execs reported %q", *execs)
	}

	code, body = do(t, s, "POST", "/v1/sandboxes/a1/exec", `{"command":[],"timeout_ms":0}`)
	if p := problemOf(t, body); code != http.StatusBadRequest || p.Code != string(errcode.InvalidRequest) {
		t.Errorf("out of bounds: %d %+v", code, p)
	}
}

// TestEmptyProgramNamesCommand: a command whose program is "" is refused naming the field
// command, buffered and streamed alike, before anything is admitted.
func TestEmptyProgramNamesCommand(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{}
	h, _ := newTestHandlers(t, f)
	s := newTestServer(t, h)
	code, body := do(t, s, "POST", "/v1/sandboxes/a1/exec", `{"command":["","x"]}`)
	if p := problemOf(t, body); code != http.StatusBadRequest || p.Field != "command" || !strings.Contains(p.Detail, "name a program") {
		t.Errorf("buffered: %d %+v", code, p)
	}
	code, body = do(t, s, "GET", "/v1/sandboxes/a1/exec/stream?command=&command=x", "", upgrade...)
	if p := problemOf(t, body); code != http.StatusBadRequest || p.Field != "command" || !strings.Contains(p.Detail, "name a program") {
		t.Errorf("streamed: %d %+v", code, p)
	}
	if len(f.admitted) != 0 || len(f.runs) != 0 {
		t.Errorf("an empty program was admitted: %d admissions, %d runs", len(f.admitted), len(f.runs))
	}
}

// TestExecCwdRefusals: the sandbox's refusals of a command's working directory reach the
// client with their own codes and statuses, not 400, and name the field cwd.
func TestExecCwdRefusals(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{}
	h, _ := newTestHandlers(t, f)
	s := newTestServer(t, h)
	for _, tc := range []struct {
		code   errcode.Code
		status int
	}{
		{errcode.FileNotFound, http.StatusNotFound},
		{errcode.NotADirectory, http.StatusConflict},
		{errcode.PermissionDenied, http.StatusForbidden},
	} {
		f.runErr = fmt.Errorf("agent: %w", errcode.New(tc.code, "The working directory \"/nope\" is refused."))
		code, body := do(t, s, "POST", "/v1/sandboxes/a1/exec", `{"command":["true"],"cwd":"/nope"}`)
		if p := problemOf(t, body); code != tc.status || p.Code != string(tc.code) || p.Field != "cwd" {
			t.Errorf("%s: %d %+v, want %d naming cwd", tc.code, code, p, tc.status)
		}
	}
}
