package agent

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/supervisor/control"
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

func TestExecSmoke(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	out, errs, st := run(t, c, control.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; id -u; exit 3"}}, "")
	t.Logf("out=%q err=%q st=%+v", out, errs, st)
	time.Sleep(0)
}
