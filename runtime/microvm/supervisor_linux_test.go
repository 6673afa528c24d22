//go:build linux

package microvm

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/supervisor"
)

// TestSupervisorDrivesAMicroVM proves the runtime keeps the runtime.Runtime contract: a
// supervisor built over it (as cmd/bothyd builds one over the namespace runtime) starts a
// sandbox, which passes its peer-credential check and hello, runs an exec and a file round
// trip in it, stops it gracefully (the agent ends it, the shim exits) and force-stops a second
// run, and leaves no runtime process behind.
func TestSupervisorDrivesAMicroVM(t *testing.T) {
	r := newRuntime(t)
	ctx := vmContext(t)
	root := filepath.Join(t.TempDir(), "root")
	st, err := store.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	// The shared assets directory stands in for the supervisor's host base: the base disk is
	// made once for all tests.
	sup, err := supervisor.New(supervisor.Options{Store: st, Runtime: sharedBase{r}, StopGrace: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	const id = "svm"
	if _, err := sup.Provision(ctx, store.Config{ID: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := supExec(ctx, t, sup, id, "uname", "-r"); strings.TrimSpace(got) != kernelRelease(r.cfg.Kernel) {
		t.Fatalf("uname -r through the supervisor: %q", got)
	}
	content := []byte("written through the supervisor\n")
	if _, err := sup.WriteFile(ctx, id, supervisor.WriteRequest{Path: "/home/user/s.txt", User: "user"}, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	rc, _, err := sup.ReadFile(ctx, id, "/home/user/s.txt", "user")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, content) {
		t.Fatalf("the file reads %q", got)
	}
	if s, err := sup.Stop(ctx, id, false); err != nil || s.State != supervisor.StateStopped {
		t.Fatalf("graceful stop: %+v, %v", s, err)
	}
	if _, err := sup.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if s, err := sup.Stop(ctx, id, true); err != nil || s.State != supervisor.StateStopped {
		t.Fatalf("forced stop: %+v, %v", s, err)
	}
	if procs, err := r.Processes(root); err != nil || len(procs) != 0 {
		t.Fatalf("runtime processes after the stops: %+v, %v", procs, err)
	}
	if err := sup.Deprovision(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// sharedBase is the runtime with every spec's host base set to the tests' shared assets.
type sharedBase struct{ *Runtime }

func (s sharedBase) Start(ctx context.Context, spec runtime.Spec) (platform.ProcessID, error) {
	spec.HostBase = sharedAssets
	return s.Runtime.Start(ctx, spec)
}

func supExec(ctx context.Context, t *testing.T, s *supervisor.Supervisor, id string, argv ...string) string {
	t.Helper()
	a, err := s.AdmitExec(ctx, id, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	res, err := s.RunExec(ctx, a, supervisor.ExecRequest{Argv: argv}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: %+v, %v", argv, res, err)
	}
	return res.Stdout
}
