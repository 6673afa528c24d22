package tests

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ctl runs bothy against a daemon and returns its stdout, stderr and exit code.
func (d *daemon) ctl(stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	cmd := exec.Command(bothyBin, args...)
	cmd.Env = append(os.Environ(), "BOTHY_URL="+d.URL)
	if d.Token != "" {
		f := filepath.Join(d.t.TempDir(), "token")
		if err := os.WriteFile(f, []byte(d.Token), 0o600); err != nil {
			d.t.Fatal(err)
		}
		cmd.Env = append(cmd.Env, "BOTHY_TOKEN_FILE="+f)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// In the daemon's network namespace, when it has one: its loopback is not the test's.
	err := startIn(d.netns, cmd)
	if err == nil {
		err = cmd.Wait()
	}
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		d.t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

func TestBothyCLI(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withToken("ctl-token-0123456789abcdef"))
	if _, stderr, code := d.ctl("", "create", "--id", "cli", "--start", "--label", "via=ctl"); code != 0 {
		t.Fatalf("create: %d %s", code, stderr)
	}
	if out, _, _ := d.ctl("", "ls", "--label", "via=ctl"); !strings.Contains(out, "cli") || !strings.Contains(out, "running") {
		t.Fatalf("ls:\n%s", out)
	}
	if out, _, code := d.ctl("", "exec", "cli", "--", "sh", "-c", "echo out; exit 5"); out != "out\n" || code != 5 {
		t.Fatalf("exec: %q, exit %d", out, code)
	}
	if out, _, code := d.ctl("echo piped $((2*21))\n", "shell", "cli"); !strings.Contains(out, "piped 42") || code != 0 {
		t.Fatalf("shell: %q, exit %d", out, code)
	}
	if _, stderr, code := d.ctl("file body", "put", "cli", "-", "/tmp/f"); code != 0 {
		t.Fatalf("put: %s", stderr)
	}
	if out, _, _ := d.ctl("", "fetch", "cli", "/tmp/f", "-"); out != "file body" {
		t.Fatalf("fetch: %q", out)
	}
	if _, stderr, code := d.ctl("", "rm", "cli"); code != 1 || !strings.Contains(stderr, "sandbox-launched") {
		t.Fatalf("rm of a running sandbox: exit %d, %s", code, stderr)
	}
	d.ctl("", "stop", "cli")
	if _, stderr, code := d.ctl("", "rm", "cli"); code != 0 {
		t.Fatalf("rm: %s", stderr)
	}
}

// TestBothyCLILifecycle: pause, resume, timeout, wait and rm -f against this server.
func TestBothyCLILifecycle(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withToken("ctl-token-0123456789abcdef"))
	if _, stderr, code := d.ctl("", "create", "life", "--start", "--timeout", "1h"); code != 0 {
		t.Fatalf("create: %d %s", code, stderr)
	}
	if _, stderr, code := d.ctl("", "pause", "life"); code != 0 {
		t.Fatalf("pause: %d %s", code, stderr)
	}
	if _, stderr, code := d.ctl("", "exec", "life", "--", "true"); code != 1 || !strings.Contains(stderr, "sandbox-paused") {
		t.Fatalf("exec on a paused sandbox: exit %d, %s", code, stderr)
	}
	if out, stderr, code := d.ctl("", "wait", "life", "--state", "paused", "--timeout", "5s"); code != 0 || strings.TrimSpace(out) != "paused" {
		t.Fatalf("wait paused: %d %q %s", code, out, stderr)
	}
	if _, stderr, code := d.ctl("", "wait", "life", "--state", "stopped", "--timeout", "100ms"); code != 1 || !strings.Contains(stderr, "wait-timeout") {
		t.Fatalf("wait stopped: exit %d, %s", code, stderr)
	}
	if _, stderr, code := d.ctl("", "resume", "life"); code != 0 {
		t.Fatalf("resume: %d %s", code, stderr)
	}
	if out, stderr, code := d.ctl("", "wait", "life", "--state", "running", "--timeout", "5s"); code != 0 || strings.TrimSpace(out) != "running" {
		t.Fatalf("wait running: %d %q %s", code, out, stderr)
	}
	if _, stderr, code := d.ctl("", "timeout", "life", "10m", "--on-timeout", "delete"); code != 0 {
		t.Fatalf("timeout: %d %s", code, stderr)
	}
	if r := d.do("GET", "/v1/sandboxes/life", nil, nil); r.Status != 200 || !strings.Contains(string(r.Body), `"on_timeout":"delete"`) {
		t.Fatalf("after timeout: %d %s", r.Status, r.Body)
	}
	if _, stderr, code := d.ctl("", "rm", "-f", "life"); code != 0 {
		t.Fatalf("rm -f: %d %s", code, stderr)
	}
	if out, stderr, code := d.ctl("", "wait", "life", "--state", "deleted"); code != 0 || strings.TrimSpace(out) != "deleted" {
		t.Fatalf("wait deleted: %d %q %s", code, out, stderr)
	}
}
