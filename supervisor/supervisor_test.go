package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	vmshim "github.com/bothy/bothy/runtime/microvm/shim"
	"github.com/bothy/bothy/runtime/namespace/shim"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// Environment of the crash helper: the test binary re-executed to start a sandbox and die
// with SIGKILL at a named step of the launch.
const (
	envCrashRoot = "SUPERVISOR_TEST_CRASH_ROOT"
	envCrashID   = "SUPERVISOR_TEST_CRASH_ID"
	envCrashAt   = "SUPERVISOR_TEST_CRASH_AT"
	// envCrashCapture names a template: the helper captures the sandbox into it instead of
	// starting it.
	envCrashCapture = "SUPERVISOR_TEST_CRASH_CAPTURE"
)

// testCgroupParent keeps the tests' cgroups apart from a real bothyd's.
const testCgroupParent = "bothyd-test-supervisor"

func TestMain(m *testing.M) {
	if code, ran := shim.Main(os.Args[1:]); ran {
		os.Exit(code)
	}
	// The microvm runtime's shim, and its guest init: the runtime boots this binary as /init.
	if code, ran := vmshim.Main(os.Args[1:]); ran {
		os.Exit(code)
	}
	if os.Getenv(envCrashAt) != "" {
		crashHelper()
		os.Exit(3) // the helper dies by SIGKILL before it gets here
	}
	os.Exit(m.Run())
}

// crashHelper starts a sandbox and kills itself at the step envCrashAt names.
func crashHelper() {
	at := os.Getenv(envCrashAt)
	crash := func(step string) {
		if step == at {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // SIGKILL cannot be caught; wait for it to land
		}
	}
	if os.Getenv(envCrashVMAssets) != "" {
		err := vmCrashHelper(crash)
		fmt.Fprintf(os.Stderr, "crash helper: the microVM's launch did not reach %q: %v\n", at, err)
		os.Exit(2)
	}
	s, err := open(os.Getenv(envCrashRoot), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s.crashPoint = crash
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if name := os.Getenv(envCrashCapture); name != "" {
		if s.templates, err = template.Open(os.Getenv(envCrashRoot), template.Options{}); err == nil {
			_, err = s.Capture(ctx, name, os.Getenv(envCrashID))
		}
		fmt.Fprintf(os.Stderr, "crash helper: the capture did not reach %q: %v\n", at, err)
		os.Exit(2)
	}
	if op := os.Getenv(envCrashCheckpoint); op != "" {
		err = checkpointCrashOp(ctx, s, os.Getenv(envCrashID), op)
		fmt.Fprintf(os.Stderr, "crash helper: the checkpoint operation %s did not reach %q: %v\n", op, at, err)
		os.Exit(2)
	}
	_, err = s.Start(ctx, os.Getenv(envCrashID))
	fmt.Fprintf(os.Stderr, "crash helper: the launch did not reach %q: %v\n", at, err)
	os.Exit(2)
}

// open makes a supervisor on a state root with the namespace runtime, or with wrap around it.
func open(root string, wrap func(runtime.Runtime) runtime.Runtime) (*Supervisor, error) {
	st, err := store.Open(root)
	if err != nil {
		return nil, err
	}
	rt, err := namespace.New(namespace.Config{CgroupParent: testCgroupParent})
	if err != nil {
		return nil, err
	}
	var r runtime.Runtime = rt
	if wrap != nil {
		r = wrap(rt)
	}
	return New(Options{Store: st, Runtime: r, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StopGrace: time.Second})
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root (the namespace runtime); CI runs as root")
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newSupervisor opens a supervisor on a fresh root; every sandbox is force-stopped and
// deleted when the test ends, and the test fails if a runtime process is left.
func newSupervisor(t *testing.T) (*Supervisor, string) {
	t.Helper()
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "root")
	s, err := open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ids, _ := s.store.List()
		for _, id := range ids {
			_, _ = s.Stop(ctx, id, true)
			_ = s.Deprovision(ctx, id)
		}
		s.Close()
		if n := shims(t, s, root); n != 0 {
			t.Errorf("%d runtime processes left after the test", n)
		}
	})
	return s, root
}

// shims counts the live runtime processes of a state root.
func shims(t *testing.T, s *Supervisor, root string) int {
	t.Helper()
	procs, err := s.rt.Processes(root)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		if p.Role == "shim" {
			n++
		}
	}
	return n
}

// TestCrashMidLaunch kills a process at each step of a launch with SIGKILL; the next
// transition (from another supervisor, as after a restart) ends the interrupted start, and
// the sandbox then starts exactly once.
func TestCrashMidLaunch(t *testing.T) {
	for _, step := range []string{"journaled", "spawned", "named", "recorded"} {
		t.Run(step, func(t *testing.T) {
			s, root := newSupervisor(t)
			ctx := testContext(t)
			id := "crash-" + step
			if _, err := s.Provision(ctx, store.Config{ID: id}); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), envCrashRoot+"="+root, envCrashID+"="+id, envCrashAt+"="+step)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the helper did not die by SIGKILL at %s: %v\n%s", step, err, out)
			}

			st, err := s.Start(ctx, id)
			switch step {
			case "recorded":
				// The launch committed before the crash: the sandbox runs, and a second
				// start is refused.
				if errcode.Of(err) != errcode.AlreadyRunning {
					t.Fatalf("start after a crash past the commit: %v, want already-running", err)
				}
			default:
				if err != nil {
					t.Fatalf("start after a crash at %s: %v", step, err)
				}
				if st.State != StateRunning {
					t.Fatalf("state %s after the start", st.State)
				}
			}
			if n := shims(t, s, root); n != 1 {
				t.Fatalf("%d runtime processes after the crash at %s and a start, want exactly 1", n, step)
			}
			if err := execTrue(ctx, s, id); err != nil {
				t.Fatalf("exec: %v", err)
			}
		})
	}
}

func execTrue(ctx context.Context, s *Supervisor, id string) error {
	a, err := s.AdmitExec(ctx, id, 10*time.Second)
	if err != nil {
		return err
	}
	defer a.Release()
	st, err := s.RunExec(ctx, a, ExecRequest{Argv: []string{"true"}}, nil)
	if err == nil && st.ExitCode != 0 {
		err = fmt.Errorf("exit %d", st.ExitCode)
	}
	return err
}

// otherBuild is a runtime that claims another identity, as another bothyd build would.
type otherBuild struct{ runtime.Runtime }

func (otherBuild) Identity() string { return "namespace/p1/another-build" }

// TestRuntimeMismatch: a sandbox started by another runtime identity is reported and never
// driven, except by a forced stop.
func TestRuntimeMismatch(t *testing.T) {
	s, root := newSupervisor(t)
	ctx := testContext(t)
	if _, err := s.Provision(ctx, store.Config{ID: "foreign"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, "foreign"); err != nil {
		t.Fatal(err)
	}
	other, err := open(root, func(r runtime.Runtime) runtime.Runtime { return otherBuild{r} })
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	st, err := other.Status("foreign")
	if err != nil || !st.RuntimeMismatch || st.State != StateRunning {
		t.Fatalf("status from another build: %+v, %v", st, err)
	}
	for name, op := range map[string]func() error{
		"start":       func() error { _, err := other.Start(ctx, "foreign"); return err },
		"stop":        func() error { _, err := other.Stop(ctx, "foreign", false); return err },
		"exec":        func() error { _, err := other.AdmitExec(ctx, "foreign", time.Second); return err },
		"files":       func() error { _, err := other.ListFiles(ctx, "foreign", "/", "user"); return err },
		"deprovision": func() error { return other.Deprovision(ctx, "foreign") },
	} {
		err := op()
		want := errcode.RuntimeMismatch
		if name == "deprovision" {
			want = errcode.SandboxLaunched
		}
		if errcode.Of(err) != want {
			t.Errorf("%s from another build: %v, want %s", name, err, want)
		}
	}
	if n := shims(t, s, root); n != 1 {
		t.Fatalf("%d runtime processes after the refusals, want the one still running", n)
	}
	st, err = other.Stop(ctx, "foreign", true)
	if err != nil || st.State != StateStopped {
		t.Fatalf("a forced stop from another build: %+v, %v", st, err)
	}
	if n := shims(t, s, root); n != 0 {
		t.Fatalf("%d runtime processes after the forced stop", n)
	}
}

// TestReattachAfterRestart: a new supervisor on the same root (a restarted bothyd) finds
// the running sandbox, dials its agent with the launch's capability, and stops it.
func TestReattachAfterRestart(t *testing.T) {
	s, root := newSupervisor(t)
	ctx := testContext(t)
	if _, err := s.Provision(ctx, store.Config{ID: "keep"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	s.Close() // the old server goes; its sandbox stays

	again, err := open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := again.ReattachAll(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := again.Status("keep"); err != nil || st.State != StateRunning {
		t.Fatalf("after the restart: %+v, %v", st, err)
	}
	if err := execTrue(ctx, again, "keep"); err != nil {
		t.Fatalf("exec after the restart: %v", err)
	}
	if _, err := again.Stop(ctx, "keep", false); err != nil {
		t.Fatalf("stop after the restart: %v", err)
	}
	if n := shims(t, again, root); n != 0 {
		t.Fatalf("%d runtime processes after the stop", n)
	}
}

// TestStartTimeout: an agent that does not answer by the deadline ends the launch with
// start-timeout, kills the runtime process and leaves no journal.
func TestStartTimeout(t *testing.T) {
	s, root := newSupervisor(t)
	ctx := testContext(t)
	if _, err := s.Provision(ctx, store.Config{ID: "slow"}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	_, err := s.Start(short, "slow")
	if errcode.Of(err) != errcode.StartTimeout && errcode.Of(err) != errcode.TransitionInProgress {
		t.Fatalf("start with a 1 ms deadline: %v, want start-timeout", err)
	}
	if n := shims(t, s, root); n != 0 {
		t.Fatalf("%d runtime processes after a start that timed out", n)
	}
	if j, err := s.store.ReadLaunchJournalUnlocked("slow"); err != nil || j != nil {
		t.Fatalf("launch journal after the timeout: %+v, %v", j, err)
	}
	st, err := s.Status("slow")
	if err != nil || st.State == StateRunning || st.State == StateStarting {
		t.Fatalf("status after the timeout: %+v, %v", st, err)
	}
	if _, err := s.Start(ctx, "slow"); err != nil {
		t.Fatalf("a start with time enough after the timeout: %v", err)
	}
}

// TestListPage: a page is the first n sandboxes after the cursor that the filter keeps, in id
// order, and says whether another follows.
func TestListPage(t *testing.T) {
	requireRoot(t)
	s, _ := newSupervisor(t)
	ctx := testContext(t)
	for _, id := range []string{"pc", "pa", "pb"} {
		if _, err := s.Create(ctx, CreateRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(sts []*Status) (out []string) {
		for _, st := range sts {
			out = append(out, st.Config.ID)
		}
		return out
	}
	all := func(*Status) bool { return true }
	for _, c := range []struct {
		after string
		n     int
		keep  func(*Status) bool
		want  []string
		more  bool
	}{
		{"", 2, all, []string{"pa", "pb"}, true},
		{"pb", 2, all, []string{"pc"}, false},
		{"", 3, all, []string{"pa", "pb", "pc"}, false},
		{"", 1, func(st *Status) bool { return st.Config.ID != "pa" }, []string{"pb"}, true},
		{"pa", 2, func(st *Status) bool { return st.Config.ID != "pb" }, []string{"pc"}, false},
	} {
		page, more, err := s.ListPage(c.after, c.n, c.keep)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(page); !slices.Equal(got, c.want) || more != c.more {
			t.Errorf("ListPage(%q, %d): %v more=%v, want %v more=%v", c.after, c.n, got, more, c.want, c.more)
		}
	}
}
