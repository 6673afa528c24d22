package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
)

// The tests of this file run the agent the way the sandbox's init does, through Run in a
// process of its own that starts with the shim's umask 0, and attack it as a hostile root
// inside the sandbox would.

const runEnv = "BOTHY_AGENT_RUN_SOCKET"

func TestRunHelper(t *testing.T) {
	sock := os.Getenv(runEnv)
	if sock == "" {
		t.Skip("helper process for the tests that run the agent through Run")
	}
	// The shim creates everything with exact modes and leaves the init, and so the agent,
	// with this umask.
	unix.Umask(0)
	err := Run(Config{
		ListenPath: sock,
		Capability: testCapability,
		Users:      map[string]UserSpec{"user": {UID: 1000, GID: 1000, Home: "/tmp"}},
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
}

// execOut runs argv as user (with umask, if not nil) in dir and returns its stdout, failing
// the test if it does not end within a deadline or exits non-zero.
func execOut(t *testing.T, c *control.Client, user, dir string, umask *uint32, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := c.Exec(ctx, control.ExecRequest{Argv: argv, User: user, Cwd: dir, Umask: umask})
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	defer p.Close()
	var out, errb bytes.Buffer
	go io.Copy(&errb, p.Stderr)
	io.Copy(&out, p.Stdout)
	st, err := p.Wait()
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("exec %v: %+v %v (stderr %q)", argv, st, err, errb.String())
	}
	return out.String()
}

// TestWorkloadUmask: a workload's files and directories are not world-writable because the
// agent's own umask is 0; it gets DefaultUmask, or the one its request names.
func TestWorkloadUmask(t *testing.T) {
	t.Parallel()
	c, _ := startHelperAgent(t, "TestRunHelper", runEnv, nil)
	mask := func(m uint32) *uint32 { return &m }
	cases := []struct {
		name  string
		umask *uint32
		want  string
	}{
		{name: "default", umask: nil, want: "0022 755 644\n"},
		{name: "asked 077", umask: mask(0o077), want: "0077 700 600\n"},
		{name: "asked 0", umask: mask(0), want: "0000 777 666\n"},
	}
	for _, tc := range cases {
		for _, user := range []string{"user", "root"} {
			t.Run(tc.name+" as "+user, func(t *testing.T) {
				dir := userDir(t)
				got := execOut(t, c, user, dir, tc.umask, "sh", "-c", `mkdir d && : > f && echo "$(umask) $(stat -c %a d) $(stat -c %a f)"`)
				if got != tc.want {
					t.Fatalf("umask, directory and file modes = %q, want %q", got, tc.want)
				}
			})
		}
	}
	// A umask beyond permission bits is refused before anything runs.
	if _, err := c.Exec(context.Background(), control.ExecRequest{Argv: []string{"true"}, Umask: mask(0o1022)}); err == nil {
		t.Fatal("an exec with umask 01022 was accepted")
	}
}

// TestRunSurvivesSignals: every signal a hostile root can send the agent but TERM (the shim's
// way to ask for shutdown) and INT leaves it serving; TERM then still shuts it down.
func TestRunSurvivesSignals(t *testing.T) {
	t.Parallel()
	c, cmd := startHelperAgent(t, "TestRunHelper", runEnv, nil)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var sigs []unix.Signal
	for _, s := range ignoredSignals() {
		sigs = append(sigs, s.(unix.Signal))
	}
	// The ones the runtime keeps must not hurt either when sent by a process.
	sigs = append(sigs, unix.SIGCHLD, unix.SIGURG, unix.SIGPIPE)
	for _, sig := range sigs {
		if err := unix.Kill(cmd.Process.Pid, sig); err != nil {
			t.Fatalf("kill %v: %v", sig, err)
		}
		// A round trip after the signal: the agent has long handled it by the time it answers.
		if got := execOut(t, c, "user", "", nil, "echo", "still here"); got != "still here\n" {
			t.Fatalf("after %v the agent answered %q", unix.SignalName(sig), got)
		}
		select {
		case err := <-exited:
			t.Fatalf("the agent ended after %v: %v", sig, err)
		default:
		}
	}
	if got := execOut(t, c, "user", "", nil, "echo", "still here"); !strings.Contains(got, "still here") {
		t.Fatalf("after every signal the agent answered %q", got)
	}
	// TERM is the shutdown request.
	if err := unix.Kill(cmd.Process.Pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the agent's exit after TERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not shut down on TERM")
	}
}

// TestListBoundsAndProc: a directory's listing stops at the request's limit, and listing
// refuses the user what reading does: the agent's own /proc entries, its descriptors above
// all.
func TestListBoundsAndProc(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	dir := userDir(t)
	const n = 1500
	for i := range n {
		if err := os.WriteFile(fmt.Sprintf("%s/f%04d", dir, i), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if list, truncated, err := c.ListLimit(ctx, dir, "user", 1000); err != nil || len(list) != 1000 || !truncated {
		t.Fatalf("listing %d entries with limit 1000: %d entries, truncated %v, %v", n, len(list), truncated, err)
	}
	if list, truncated, err := c.ListLimit(ctx, dir, "user", n); err != nil || len(list) != n || truncated {
		t.Fatalf("listing %d entries with limit %d: %d entries, truncated %v, %v", n, n, len(list), truncated, err)
	}

	if !isRoot() {
		t.Skip("the user is the agent's own user without root: /proc is its to list")
	}
	for _, p := range []string{"/proc/self/fd", "/proc/self/fd/", "/proc/thread-self/fd", "/proc/self/task", "/proc/self"} {
		if list, err := c.List(ctx, p, "user"); errcode.Of(err) != errcode.PermissionDenied {
			t.Errorf("user listed %s through the agent: %d entries, %v", p, len(list), err)
		}
	}
	if list, err := c.List(ctx, "/proc/self/fd", "root"); err != nil || len(list) == 0 {
		t.Fatalf("root listing /proc/self/fd: %d entries, %v", len(list), err)
	}
}

// TestRemoveDeepTree: a recursive remove of a tree 22 000 directories deep, under a limit of
// 1024 descriptors, succeeds; os.RemoveAll, which it replaced, fails with "too many open
// files". Not parallel: the descriptor limit is the process's.
func TestRemoveDeepTree(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	dir := userDir(t)
	const depth = 22000
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The tree is the user's, as one the user made by a mkdir loop would be.
	for range depth {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		fd = next
		if isRoot() {
			if err := unix.Fchown(fd, 1000, 1000); err != nil {
				t.Fatal(err)
			}
		}
	}
	unix.Close(fd)

	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = min(1024, old.Max)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	err = c.Remove(context.Background(), dir+"/d", "user", true)
	unix.Setrlimit(unix.RLIMIT_NOFILE, &old)
	if err != nil {
		t.Fatalf("removing a tree %d deep: %.300v", depth, err)
	}
	if _, err := os.Lstat(dir + "/d"); !os.IsNotExist(err) {
		t.Fatalf("the tree is still there: %v", err)
	}
}
