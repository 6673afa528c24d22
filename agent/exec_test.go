package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
)

// run executes req and collects everything.
func run(t testing.TB, c *control.Client, req control.ExecRequest, stdin string) (string, string, control.ExitStatus) {
	t.Helper()
	req.Stdin = req.Stdin || stdin != ""
	p, err := c.Exec(context.Background(), req)
	if err != nil {
		t.Fatalf("exec %v: %v", req.Argv, err)
	}
	defer p.Close()
	if p.Stdin != nil {
		go func() {
			io.WriteString(p.Stdin, stdin)
			p.Stdin.Close()
		}()
	}
	var out, errb bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(&out, p.Stdout) }()
	go func() { defer wg.Done(); io.Copy(&errb, p.Stderr) }()
	wg.Wait()
	st, err := p.Wait()
	if err != nil {
		t.Fatalf("wait %v: %v", req.Argv, err)
	}
	return out.String(), errb.String(), st
}

func TestExec(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	uid, rootUID := "1000", "0"
	if !isRoot() {
		uid = strconv.Itoa(os.Getuid())
		rootUID = uid
	}
	cases := []struct {
		name       string
		req        control.ExecRequest
		stdin      string
		out, err   string
		exit       int
		signal     string
		outContain string
	}{
		{name: "streams and exit code", req: control.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, out: "out\n", err: "err\n", exit: 3},
		{name: "stdin through cat", req: control.ExecRequest{Argv: []string{"cat"}}, stdin: "hello\nworld\n", out: "hello\nworld\n"},
		{name: "stdin closed without data", req: control.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: true}, out: "0\n"},
		{name: "no stdin reads /dev/null", req: control.ExecRequest{Argv: []string{"cat"}}, out: ""},
		{name: "runs as user", req: control.ExecRequest{Argv: []string{"id", "-u"}}, out: uid + "\n"},
		{name: "root on request", req: control.ExecRequest{Argv: []string{"id", "-u"}, User: "root"}, out: rootUID + "\n"},
		{name: "no supplementary groups", req: control.ExecRequest{Argv: []string{"sh", "-c", "id -G | wc -w"}}, out: "1\n"},
		{name: "cwd", req: control.ExecRequest{Argv: []string{"pwd"}, Cwd: "/usr"}, out: "/usr\n"},
		{name: "default cwd is home", req: control.ExecRequest{Argv: []string{"pwd"}}, out: "/tmp\n"},
		{name: "env defaults and overrides", req: control.ExecRequest{Argv: []string{"sh", "-c", `echo "$HOME $USER $FOO $PATH"`}, Env: []string{"FOO=bar", "HOME=/elsewhere"}},
			out: "/elsewhere user bar /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
		{name: "killed by a signal", req: control.ExecRequest{Argv: []string{"sh", "-c", "kill -USR1 $$"}}, exit: 128 + 10, signal: "USR1"},
		{name: "tty sees a terminal", req: control.ExecRequest{Argv: []string{"sh", "-c", "test -t 0 && test -t 1 && echo tty; echo $TERM"}, TTY: true}, out: "tty\r\nxterm-256color\r\n"},
		{name: "tty initial size", req: control.ExecRequest{Argv: []string{"stty", "size"}, TTY: true, Rows: 33, Cols: 99}, out: "33 99\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, errs, st := run(t, c, tc.req, tc.stdin)
			if out != tc.out || errs != tc.err {
				t.Errorf("stdout %q stderr %q, want %q %q", out, errs, tc.out, tc.err)
			}
			if st.ExitCode != tc.exit || st.Signal != tc.signal || st.TimedOut {
				t.Errorf("status %+v, want exit %d signal %q", st, tc.exit, tc.signal)
			}
		})
	}
}

func TestExecStartErrors(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	cases := []struct {
		name   string
		req    control.ExecRequest
		remote string
		code   errcode.Code
	}{
		{"unknown command", control.ExecRequest{Argv: []string{"no-such-command-xyz"}}, control.CodeCommandNotFound, errcode.InvalidRequest},
		{"missing absolute command", control.ExecRequest{Argv: []string{"/nonexistent/bin"}}, control.CodeCommandNotFound, errcode.InvalidRequest},
		{"missing cwd", control.ExecRequest{Argv: []string{"true"}, Cwd: "/nonexistent"}, control.CodeFileNotFound, errcode.FileNotFound},
		{"cwd a file", control.ExecRequest{Argv: []string{"true"}, Cwd: "/etc/passwd"}, control.CodeNotADirectory, errcode.NotADirectory},
		{"not executable", control.ExecRequest{Argv: []string{"/etc/passwd"}}, control.CodeNotExecutable, errcode.InvalidRequest},
		{"relative cwd", control.ExecRequest{Argv: []string{"true"}, Cwd: "tmp"}, control.CodeInvalidRequest, errcode.InvalidRequest},
		{"empty argv", control.ExecRequest{}, control.CodeInvalidRequest, errcode.InvalidRequest},
		{"bad env", control.ExecRequest{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}, control.CodeInvalidRequest, errcode.InvalidRequest},
		{"unknown user", control.ExecRequest{Argv: []string{"true"}, User: "mallory"}, control.CodeInvalidRequest, errcode.InvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := c.Exec(context.Background(), tc.req)
			var re *control.RemoteError
			if !errors.As(err, &re) || re.Code != tc.remote || !errors.Is(err, tc.code) {
				t.Fatalf("err = %v, want remote %s and %s", err, tc.remote, tc.code)
			}
		})
	}
}

func TestExecTimeout(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	start := time.Now()
	out, _, st := run(t, c, control.ExecRequest{Argv: []string{"sh", "-c", "echo begin; sleep 100 & sleep 100"}, TimeoutMS: 200}, "")
	if !st.TimedOut || st.Signal != "KILL" || out != "begin\n" {
		t.Fatalf("status %+v out %q, want timed out by KILL", st, out)
	}
	// The background sleep was in the process group: it holds no pipe open after the kill,
	// so the exec ended well before the sleeps would have.
	if d := time.Since(start); d > 50*time.Second {
		t.Fatalf("exec took %v", d)
	}
}

func TestExecSignal(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	for _, name := range []string{"TERM", "SIGINT"} {
		p, err := c.Exec(context.Background(), control.ExecRequest{Argv: []string{"sleep", "100"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Signal(name); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, p.Stderr)
		io.Copy(io.Discard, p.Stdout)
		st, err := p.Wait()
		want := strings.TrimPrefix(name, "SIG")
		if err != nil || st.Signal != want || st.ExitCode != 128+int(unix.SignalNum("SIG"+want)) {
			t.Fatalf("%s: status %+v err %v", name, st, err)
		}
		p.Close()
	}
}

// TestExecTTYResize: a resize takes effect in its place among the keystrokes: a command sent
// right after it sees the new size, every time.
func TestExecTTYResize(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	p, err := c.Exec(context.Background(), control.ExecRequest{
		Argv: []string{"sh", "-c", "stty -echo; echo ready; while read x; do stty size; done"}, TTY: true, Stdin: true, Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(p.Stdout)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("output ended")
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no output within 10s")
		}
		return ""
	}
	for next() != "ready" {
	}
	for _, size := range [][2]uint16{{40, 120}, {25, 70}, {50, 200}, {40, 120}} {
		if err := p.Resize(size[0], size[1]); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(p.Stdin, "\n"); err != nil {
			t.Fatal(err)
		}
		if got, want := next(), fmt.Sprintf("%d %d", size[0], size[1]); got != want {
			t.Fatalf("a command sent right after a resize to %s saw %q", want, got)
		}
	}
	p.Stdin.Close() // ^D ends the read loop
	for range lines {
	}
	st, err := p.Wait()
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("status %+v err %v", st, err)
	}
}

// TestExecClientGoneKills checks the protocol's rule: a stream closed before the exit kills
// the workload, with its process group.
func TestExecClientGoneKills(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	for _, tty := range []bool{false, true} {
		for _, how := range []string{"stream", "connection"} {
			c := ta.dial(t)
			p, err := c.Exec(context.Background(), control.ExecRequest{
				Argv: []string{"sh", "-c", "sleep 100 & echo $!; wait"}, TTY: tty})
			if err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(p.Stdout).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			child, err := strconv.Atoi(strings.TrimSpace(line))
			if err != nil {
				t.Fatal(err)
			}
			if how == "stream" {
				p.Close()
			} else {
				c.Close()
			}
			for _, pid := range []int{p.PID, child} {
				waitFor(t, "workload "+strconv.Itoa(pid)+" to end", 10*time.Second, func() bool { return !alive(pid) })
			}
		}
	}
}

// alive reports whether pid runs and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	p, ok := parseStat(pid, b)
	return ok && p.state != 'Z'
}

// TestExecLargeOutput checks a large output arrives complete and in order, and that a reader
// that stops makes the workload wait instead of the agent buffering.
func TestExecLargeOutput(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	const size = 64 << 20
	dir := worldDir(t)
	path := filepath.Join(dir, "big")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, want), io.LimitReader(rand.Reader, size)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Chmod(path, 0o644)

	p, err := c.Exec(context.Background(), control.ExecRequest{Argv: []string{"cat", path}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	go io.Copy(io.Discard, p.Stderr)
	got := sha256.New()
	if _, err := io.CopyN(got, p.Stdout, 1<<20); err != nil {
		t.Fatal(err)
	}
	// Stop reading. The writer must stall: wait until cat's written byte count stops
	// changing, then check it stalled far short of the whole file.
	var last int64 = -1
	stable := 0
	waitFor(t, "cat to stall", 20*time.Second, func() bool {
		n := writtenBytes(p.PID)
		if n == last {
			stable++
		} else {
			stable, last = 0, n
		}
		return stable >= 20 // unchanged for 20 polls (~100 ms)
	})
	if last < 0 || last > 16<<20 {
		t.Fatalf("cat wrote %d bytes while nobody read: output is buffered, not flow-controlled", last)
	}
	if _, err := io.Copy(got, p.Stdout); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("status %+v err %v", st, err)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("output differs from the file")
	}
}

// writtenBytes reads wchar of /proc/<pid>/io, or -1.
func writtenBytes(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "wchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

func TestExecManyConcurrent(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	clients := []*control.Client{ta.dial(t), ta.dial(t)}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i%2]
			out, _, st := run(t, c, control.ExecRequest{Argv: []string{"sh", "-c", "echo $0", strconv.Itoa(i)}}, "")
			if out != strconv.Itoa(i)+"\n" || st.ExitCode != 0 {
				t.Errorf("exec %d: out %q status %+v", i, out, st)
			}
		}()
	}
	wg.Wait()
}

// TestExecBackgroundChild: a child left running with the pipes open does not hold the exec
// after the workload exited.
func TestExecBackgroundChild(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	out, _, st := run(t, c, control.ExecRequest{Argv: []string{"sh", "-c", "sleep 60 & echo $!"}}, "")
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("out %q", out)
	}
	defer unix.Kill(pid, unix.SIGKILL)
	if st.ExitCode != 0 || !alive(pid) {
		t.Fatalf("status %+v, child alive %v", st, alive(pid))
	}
}

// waitOOMScore is a shell script that prints its own oom_score_adj once it is
// WorkloadOOMScoreAdj, or after 100000 looks: the agent raises it right after the start, so
// the first look may come before.
var waitOOMScore = fmt.Sprintf(`i=0; while read s </proc/$$/oom_score_adj; [ "$s" != %d ] && [ $i -lt 100000 ]; do i=$((i+1)); done; echo $s`, WorkloadOOMScoreAdj)

// TestExecOOMScore: every workload, whatever user it runs as, gets WorkloadOOMScoreAdj,
// above the agent's own, so that the OOM killer takes it first.
func TestExecOOMScore(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	for _, user := range []string{"user", "root"} {
		out, errs, st := run(t, c, control.ExecRequest{Argv: []string{"sh", "-c", waitOOMScore}, User: user}, "")
		if st.ExitCode != 0 || strings.TrimSpace(out) != strconv.Itoa(WorkloadOOMScoreAdj) {
			t.Errorf("as %s: oom_score_adj %q (stderr %q, %+v), want %d", user, out, errs, st, WorkloadOOMScoreAdj)
		}
	}
}
