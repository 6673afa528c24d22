package control

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/bothy/bothy/errcode"
)

// An agent whose handler neither watches nor tracks processes announces neither feature, and
// the client asks it for neither.
func TestWatchAndProcsWithoutFeature(t *testing.T) {
	t.Parallel()
	c, _ := dial(t, newFake())
	for _, f := range []string{FeatureWatch, FeatureProcs} {
		if slices.Contains(c.Features(), f) {
			t.Fatalf("a handler without it announced %s", f)
		}
	}
	ctx := context.Background()
	if _, err := c.Watch(ctx, WatchRequest{Path: "/tmp"}); err == nil {
		t.Fatal("Watch on an agent without the feature succeeded")
	}
	if _, err := c.StartTracked(ctx, ProcRequest{Exec: &ExecRequest{Argv: []string{"echo"}}}); err == nil {
		t.Fatal("StartTracked on an agent without the feature succeeded")
	}
	if _, err := c.ListTracked(ctx); err == nil {
		t.Fatal("ListTracked on an agent without the feature succeeded")
	}
}

func TestProcHeaderValidation(t *testing.T) {
	t.Parallel()
	for _, h := range []Header{
		{Op: OpProcStart, Proc: &ProcRequest{}},
		{Op: OpProcStart, Proc: &ProcRequest{Exec: &ExecRequest{}}},
		{Op: OpProcAttach, Proc: &ProcRequest{}},
		{Op: OpProcInput},
		{Op: OpProcInput, Proc: &ProcRequest{PID: 1, Stdin: make([]byte, MaxProcInput+1)}},
		{Op: OpProcInput, Proc: &ProcRequest{PID: 1, Signal: strings.Repeat("X", 17)}},
		{Op: OpProcStart, Proc: &ProcRequest{Exec: &ExecRequest{Argv: []string{"x"}}, Client: make([]byte, MaxProcClientData+1)}},
		{Op: OpWatch},
		{Op: OpWatch, Watch: &WatchRequest{Path: "relative"}},
	} {
		if err := h.Validate(); !errors.Is(asRemote(err).Err(), errcode.InvalidRequest) {
			t.Errorf("%s %+v: %v, want invalid-request", h.Op, h.Proc, err)
		}
	}
	for _, h := range []Header{
		{Op: OpProcList},
		{Op: OpProcAttach, Proc: &ProcRequest{Tag: "t"}},
		{Op: OpProcInput, Proc: &ProcRequest{PID: 3, EOF: true}},
		{Op: OpWatch, Watch: &WatchRequest{Path: "/tmp", Recursive: true}},
	} {
		if err := h.Validate(); err != nil {
			t.Errorf("%s: %v", h.Op, err)
		}
	}
}

// LocalExec runs a handler's Exec with its frames going to a function and its stdin coming
// from calls: what a tracked process is made of.
func TestLocalExec(t *testing.T) {
	t.Parallel()
	var (
		mu     sync.Mutex
		pid    string
		stdout strings.Builder
		stderr strings.Builder
	)
	l := NewLocalExec(true, func(ft FrameType, p []byte) error {
		mu.Lock()
		defer mu.Unlock()
		switch ft {
		case FrameStarted:
			pid = string(p)
		case FrameStdout:
			stdout.Write(p)
		case FrameStderr:
			stderr.Write(p)
		}
		return nil
	})
	done := make(chan ExitStatus)
	go func() {
		st, _ := newFake().Exec(context.Background(), &ExecRequest{Argv: []string{"echo"}}, l.Stream())
		l.Finish()
		done <- st
	}()
	ctx := context.Background()
	if err := l.Stdin(ctx, []byte("through stdin")); err != nil {
		t.Fatal(err)
	}
	l.CloseStdin()
	if err := l.Stdin(ctx, []byte("late")); err == nil {
		t.Fatal("stdin after its end was taken")
	}
	st := <-done
	mu.Lock()
	defer mu.Unlock()
	if st.ExitCode != 5 || pid != `{"pid":42}` || stdout.String() != "through stdin" || stderr.String() != "done" {
		t.Fatalf("exit %+v, started %s, stdout %q, stderr %q", st, pid, stdout.String(), stderr.String())
	}
	if err := l.Signal(ctx, "TERM"); err == nil {
		t.Fatal("a signal after the end was taken")
	}
}
