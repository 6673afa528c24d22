package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
)

// readUntil reads p's output until it contains want, and returns all of it; the attachment
// is closed at the deadline so that a missing output fails instead of hanging.
func readUntil(t *testing.T, p *control.Process, want string) string {
	t.Helper()
	timer := time.AfterFunc(20*time.Second, func() { p.Close() })
	defer timer.Stop()
	var out bytes.Buffer
	buf := make([]byte, 64<<10)
	for !strings.Contains(out.String(), want) {
		_, n, err := p.ReadOutput(buf)
		out.Write(buf[:n])
		if err != nil {
			t.Fatalf("waiting for %q: %v (output %q)", want, err, out.String())
		}
	}
	return out.String()
}

// drain reads p to its end and returns the rest of the output and the exit status.
func drain(t *testing.T, p *control.Process) (string, control.ExitStatus) {
	t.Helper()
	timer := time.AfterFunc(20*time.Second, func() { p.Close() })
	defer timer.Stop()
	var out bytes.Buffer
	buf := make([]byte, 64<<10)
	for {
		_, n, err := p.ReadOutput(buf)
		out.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading to the end: %v (output %q)", err, out.String())
		}
	}
	st, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), st
}

// A tracked process outlives the connection that started it: a new connection lists it,
// attaches with the output so far, feeds it stdin and gets its exit.
func TestTrackedOutlivesConnection(t *testing.T) {
	ta := startAgent(t)
	c1 := ta.dial(t)
	ctx := context.Background()
	p, err := c1.StartTracked(ctx, control.ProcRequest{Tag: "job", Client: []byte("mine"), Exec: &control.ExecRequest{
		Argv: []string{"sh", "-c", "echo one; read x; echo got $x"}, Stdin: true}})
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, p, "one\n")
	c1.Close() // an exec would be killed now

	c2 := ta.dial(t)
	l, err := c2.ListTracked(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(l.Processes, func(pi control.ProcInfo) bool { return pi.PID == p.PID })
	if i < 0 {
		t.Fatalf("list %+v lacks pid %d", l.Processes, p.PID)
	}
	if got := l.Processes[i]; got.Tag != "job" || string(got.Client) != "mine" || got.Argv[0] != "sh" {
		t.Fatalf("listed %+v", got)
	}
	again, err := c2.AttachTracked(ctx, 0, "job", true)
	if err != nil {
		t.Fatal(err)
	}
	if again.PID != p.PID {
		t.Fatalf("attached by tag to pid %d, want %d", again.PID, p.PID)
	}
	readUntil(t, again, "one\n") // the replay
	if err := c2.InputTracked(ctx, control.ProcRequest{PID: p.PID, Stdin: []byte("two\n"), EOF: true}); err != nil {
		t.Fatal(err)
	}
	out, st := drain(t, again)
	if out != "got two\n" || st.ExitCode != 0 {
		t.Fatalf("after the input: %q, %+v", out, st)
	}
	if _, err := c2.AttachTracked(ctx, p.PID, "", false); err == nil || !strings.Contains(err.Error(), control.CodeProcessNotFound) {
		t.Fatalf("attaching to an ended process: %v, want %s", err, control.CodeProcessNotFound)
	}
}

// Every attached stream gets all of the output; detaching one leaves the others and the
// process alone.
func TestTrackedFanOut(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	p, err := c.StartTracked(ctx, control.ProcRequest{Exec: &control.ExecRequest{
		Argv: []string{"sh", "-c", "read x; echo $x; read y; echo $y"}, Stdin: true}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.AttachTracked(ctx, p.PID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AttachTracked(ctx, p.PID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := c.InputTracked(ctx, control.ProcRequest{PID: p.PID, Stdin: []byte("hi\nho\n")}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*control.Process{p, a} {
		out, st := drain(t, x)
		if out != "hi\nho\n" || st.ExitCode != 0 {
			t.Fatalf("stream of pid %d: %q, %+v", x.PID, out, st)
		}
	}
}

func TestTrackedSignal(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	p, err := c.StartTracked(ctx, control.ProcRequest{Exec: &control.ExecRequest{Argv: []string{"sleep", "30"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.InputTracked(ctx, control.ProcRequest{PID: p.PID, Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	if _, st := drain(t, p); st.Signal != "KILL" || st.ExitCode != 137 {
		t.Fatalf("after KILL: %+v", st)
	}
	if err := c.InputTracked(ctx, control.ProcRequest{PID: p.PID, Signal: "KILL"}); err == nil {
		t.Fatal("input to an ended process succeeded")
	}
	if _, err := c.StartTracked(ctx, control.ProcRequest{Exec: &control.ExecRequest{Argv: []string{"no-such-command-here"}}}); err == nil || !strings.Contains(err.Error(), control.CodeCommandNotFound) {
		t.Fatalf("starting a missing command: %v", err)
	}
}

// With nobody attached the agent keeps only the latest output, bounded.
func TestTrackedReplayBounded(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	dir := userDir(t)
	done := filepath.Join(dir, "done")
	p, err := c.StartTracked(ctx, control.ProcRequest{Exec: &control.ExecRequest{
		Argv: []string{"sh", "-c", "head -c 4000000 /dev/zero; echo END; touch " + done + "; exec sleep 30"}}})
	if err != nil {
		t.Fatal(err)
	}
	p.Close() // detach at once: the output then has nobody to wait for
	waitFor(t, "the whole output", 20*time.Second, func() bool {
		_, err := os.Stat(done)
		return err == nil
	})
	a, err := c.AttachTracked(ctx, p.PID, "", true)
	if err != nil {
		t.Fatal(err)
	}
	out := readUntil(t, a, "END\n")
	// What the attach reads is the replay plus what was still on its way when the process
	// finished: the workload's stdout pipe (control.OutputPipeSize) and a frame in flight.
	// Both are far below the 4 MB the process wrote, so an unbounded replay still fails.
	if len(out) > control.ProcReplayBytes+control.OutputPipeSize+256<<10 {
		t.Fatalf("the replay held %d bytes, more than its bound", len(out))
	}
	if err := c.InputTracked(ctx, control.ProcRequest{PID: p.PID, Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
}

func TestTrackedTTYResize(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	p, err := c.StartTracked(ctx, control.ProcRequest{Exec: &control.ExecRequest{
		Argv: []string{"sh", "-c", "stty size; read x; stty size"}, TTY: true, Stdin: true, Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, p, "24 80")
	if err := c.InputTracked(ctx, control.ProcRequest{PID: p.PID, Resize: &control.WindowSize{Rows: 30, Cols: 100}}); err != nil {
		t.Fatal(err)
	}
	if err := c.InputTracked(ctx, control.ProcRequest{PID: p.PID, Stdin: []byte("\n")}); err != nil {
		t.Fatal(err)
	}
	readUntil(t, p, "30 100")
}
