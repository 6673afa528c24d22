package tests

import (
	"net/url"
	"testing"
)

// TestExecUmask: a workload's umask is the request's when it names one, through the
// buffered exec, the stream and bothy, and 022 when it does not; a umask that is not
// octal is refused before anything runs.
func TestExecUmask(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("umask", true)
	// Each run makes its own directory: another user's cannot be replaced in /tmp.
	const made = "dir=$(mktemp -d) && cd $dir && : > f && mkdir d && stat -c %a f d && umask"

	if got := d.exec("umask", map[string]any{"command": []string{"sh", "-c", made}}); got.ExitCode != 0 || got.Stdout != "644\n755\n0022\n" {
		t.Fatalf("the default umask: %+v", got)
	}
	if got := d.exec("umask", map[string]any{"command": []string{"sh", "-c", made}, "umask": "0077"}); got.ExitCode != 0 || got.Stdout != "600\n700\n0077\n" {
		t.Fatalf("umask 0077, buffered: %+v", got)
	}
	if got := d.exec("umask", map[string]any{"command": []string{"sh", "-c", made}, "umask": "027", "user": "root"}); got.Stdout != "640\n750\n0027\n" {
		t.Fatalf("umask 027 as root: %+v", got)
	}

	s, resp, err := d.dialStream("umask", url.Values{"command": {"sh", "-c", made}, "umask": {"0077"}})
	if err != nil {
		t.Fatalf("stream with umask 0077: %v (%+v)", err, resp)
	}
	if exit := s.wait(); exit.ExitCode != 0 || s.stdout.String() != "600\n700\n0077\n" {
		t.Fatalf("umask 0077, streamed: exit %+v, stdout %q", exit, s.stdout.String())
	}

	if out := d.ctlOK("", "exec", "umask", "--umask", "0007", "--", "sh", "-c", made); out != "660\n770\n0007\n" {
		t.Fatalf("bothy exec --umask 0007: %q", out)
	}

	for _, bad := range []any{"77", "0800", 63} {
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes/umask/exec", map[string]any{"command": []string{"true"}, "umask": bad}), 400, "invalid-request")
	}
	if _, resp, err := d.dialStream("umask", url.Values{"command": {"true"}, "umask": {"9"}}); err == nil || resp == nil || resp.StatusCode != 400 {
		t.Fatalf("stream with umask 9: %v, %+v; want 400", err, resp)
	}
}
