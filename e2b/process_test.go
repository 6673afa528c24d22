package e2b

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/bothy/bothy/e2b/envd/process"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// fakeAttachment is a tracked process's attachment: its output, then its end with status,
// or (running) no end until it is closed.
type fakeAttachment struct {
	out     []string
	status  supervisor.ExitStatus
	running bool
	closed  chan struct{}
	once    sync.Once
}

func newFakeAttachment(status supervisor.ExitStatus, running bool, out ...string) *fakeAttachment {
	return &fakeAttachment{out: out, status: status, running: running, closed: make(chan struct{})}
}

func (a *fakeAttachment) ReadOutput(p []byte) (supervisor.Stream, int, error) {
	if len(a.out) > 0 {
		n := copy(p, a.out[0])
		a.out = a.out[1:]
		return supervisor.Stdout, n, nil
	}
	if a.running {
		<-a.closed
	}
	return supervisor.Stdout, 0, io.EOF
}

func (a *fakeAttachment) Wait() (supervisor.ExitStatus, error) { return a.status, nil }

func (a *fakeAttachment) Close() error { a.once.Do(func() { close(a.closed) }); return nil }

// relayed runs relay on att and returns the events it sent and what it returned.
func relayed(ctx context.Context, att *fakeAttachment, limited bool) ([]*process.ProcessEvent, error) {
	var sent []*process.ProcessEvent
	err := relay(ctx, att, false, limited, 0, func(ev *process.ProcessEvent) error {
		sent = append(sent, ev)
		return nil
	})
	return sent, err
}

// TestRelayEnds: a stream ends with the process's end event; at its call's deadline with
// deadline_exceeded (what the SDKs make a TimeoutException of), also when the process was
// killed at Start's time limit, which is that deadline; and without error when the client
// leaves.
func TestRelayEnds(t *testing.T) {
	t.Parallel()
	t.Run("exit", func(t *testing.T) {
		t.Parallel()
		sent, err := relayed(context.Background(), newFakeAttachment(supervisor.ExitStatus{ExitCode: 3}, false, "out"), true)
		if err != nil {
			t.Fatalf("relay: %v", err)
		}
		if len(sent) != 2 || string(sent[0].GetData().GetStdout()) != "out" || sent[1].GetEnd().GetExitCode() != 3 {
			t.Fatalf("events %v, want the output and an end with exit code 3", sent)
		}
	})
	t.Run("deadline while it runs", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		att := newFakeAttachment(supervisor.ExitStatus{}, true, "started")
		sent, err := relayed(ctx, att, true)
		if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
			t.Fatalf("relay returned %v, want deadline_exceeded", err)
		}
		if len(sent) != 1 || sent[0].GetEnd() != nil {
			t.Fatalf("events %v, want the output alone", sent)
		}
		select {
		case <-att.closed:
		default:
			t.Fatal("the attachment is still open")
		}
	})
	t.Run("killed at Start's time limit", func(t *testing.T) {
		t.Parallel()
		sent, err := relayed(context.Background(), newFakeAttachment(supervisor.ExitStatus{ExitCode: 137, Signal: "KILL", TimedOut: true}, false), true)
		if connect.CodeOf(err) != connect.CodeDeadlineExceeded || len(sent) != 0 {
			t.Fatalf("relay returned %v after %v, want deadline_exceeded and no end event", err, sent)
		}
	})
	t.Run("a Connect sees that end", func(t *testing.T) {
		t.Parallel()
		sent, err := relayed(context.Background(), newFakeAttachment(supervisor.ExitStatus{ExitCode: 137, Signal: "KILL", TimedOut: true}, false), false)
		if err != nil || len(sent) != 1 || sent[0].GetEnd().GetError() == "" || sent[0].GetEnd().GetExited() {
			t.Fatalf("relay returned %v after %v, want an end event that names the time limit", err, sent)
		}
	})
	t.Run("the client leaves", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := relayed(ctx, newFakeAttachment(supervisor.ExitStatus{}, true), true); err != nil {
			t.Fatalf("relay returned %v, want nil: no one reads the answer", err)
		}
	})
}

// TestResolvePathAsEnvd: envd resolves a path against the user's home (issue 38): E2B's SDKs
// pass "hello.txt" and "~/x" and expect them there.
func TestResolvePathAsEnvd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, user, want string }{
		{"hello.txt", "user", "/home/user/hello.txt"},
		{"hello.txt", "root", "/root/hello.txt"},
		{"", "user", "/home/user"},
		{"~", "user", "/home/user"},
		{"~/a/../b", "root", "/root/b"},
		{"../../etc/passwd", "user", "/etc/passwd"},
		{"/tmp//x/", "user", "/tmp/x"},
		{"./d/e", "user", "/home/user/d/e"},
	} {
		got, err := resolvePath(tc.in, tc.user)
		if err != nil || got != tc.want {
			t.Errorf("resolvePath(%q, %q) = %q, %v; want %q", tc.in, tc.user, got, err, tc.want)
		}
	}
	if _, err := resolvePath("~other/x", "user"); err == nil {
		t.Errorf("~other/x was resolved; envd refuses another user's home")
	}
}

// TestFileRefusalsAsEnvd: the refusals of a sandbox's files reach E2B's SDKs as envd answers
// the same case: its 400 / invalid_argument (InvalidArgumentError) for a directory read as a
// file, a listing of a file, a path in the way; failed_precondition for a symbolic-link loop;
// permission_denied (403) where envd, acting as root, has no answer of its own. A Start whose
// cwd the sandbox refuses is invalid_argument, as envd answers a cwd that does not exist.
func TestFileRefusalsAsEnvd(t *testing.T) {
	t.Parallel()
	cases := []struct {
		code    errcode.Code
		status  int
		connect connect.Code
	}{
		{errcode.FileNotFound, http.StatusNotFound, connect.CodeNotFound},
		{errcode.IsADirectory, http.StatusBadRequest, connect.CodeInvalidArgument},
		{errcode.NotADirectory, http.StatusBadRequest, connect.CodeInvalidArgument},
		{errcode.NotARegularFile, http.StatusBadRequest, connect.CodeInvalidArgument},
		{errcode.DirectoryNotEmpty, http.StatusBadRequest, connect.CodeInvalidArgument},
		{errcode.FileExists, http.StatusBadRequest, connect.CodeInvalidArgument},
		{errcode.NameTooLong, http.StatusBadRequest, connect.CodeInvalidArgument},
		{errcode.PermissionDenied, http.StatusForbidden, connect.CodePermissionDenied},
		{errcode.SymlinkLoop, http.StatusConflict, connect.CodeFailedPrecondition},
		{errcode.MountInside, http.StatusConflict, connect.CodeFailedPrecondition},
		{errcode.FileChanged, http.StatusConflict, connect.CodeFailedPrecondition},
	}
	for _, tc := range cases {
		err := fmt.Errorf("agent: %w", errcode.New(tc.code, "Why."))
		if got := statusOf(err); got != tc.status {
			t.Errorf("%s: HTTP %d, want %d", tc.code, got, tc.status)
		}
		if got := connect.CodeOf(connectError(err)); got != tc.connect {
			t.Errorf("%s: %v, want %v", tc.code, got, tc.connect)
		}
	}
	for _, code := range []errcode.Code{errcode.FileNotFound, errcode.NotADirectory, errcode.PermissionDenied} {
		err := startError(errcode.New(code, "The working directory \"/nope\" does not exist inside the sandbox."))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "/nope") {
			t.Errorf("Start with a refused cwd (%s): %v, want invalid_argument with the message", code, err)
		}
	}
	if got := connect.CodeOf(startError(errcode.New(errcode.PidsLimit, "Full."))); got != connect.CodeResourceExhausted {
		t.Errorf("Start at the pids limit: %v, want resource_exhausted", got)
	}
}
