package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAuthByDefault: a bothyd started with no token options generates one into its state
// root, readable by its own user alone, requires it, keeps it across restarts, and bothy
// finds it there. --insecure-no-auth is the explicit way out.
func TestAuthByDefault(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	path := filepath.Join(d.Root, "token")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Fatalf("the token file has mode %o, want 600", perm)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
		t.Fatalf("the token file belongs to uid %d, not to bothyd's user %d", uid, os.Geteuid())
	}
	if len(d.Token) < 32 {
		t.Fatalf("the generated token %q is short", d.Token)
	}
	if strings.Contains(d.logs.String(), d.Token) {
		t.Fatal("the generated token is in bothyd's log")
	}

	wantProblem(t, d.do("GET", "/v1/sandboxes", nil, http.Header{"Authorization": {""}}), http.StatusUnauthorized, "unauthorized")
	if r := d.do("GET", "/v1/sandboxes", nil, nil); r.Status != http.StatusOK {
		t.Fatalf("with the generated token: %d %s", r.Status, r.Body)
	}

	// The login URL's code, not the token, is in the log; it gives the token once.
	u, err := url.Parse(d.LoginURL())
	if err != nil {
		t.Fatal(err)
	}
	code := strings.TrimPrefix(u.Fragment, "login=")
	body := `{"code":"` + code + `"}`
	r := d.do("POST", "/login", strings.NewReader(body), http.Header{"Authorization": {""}})
	var out struct{ Token string }
	if r.Status != 200 || json.Unmarshal(r.Body, &out) != nil || out.Token != d.Token {
		t.Fatalf("the login code: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("POST", "/login", strings.NewReader(body), http.Header{"Authorization": {""}}), http.StatusUnauthorized, "unauthorized")

	t.Run("bothy finds it in the state root", func(t *testing.T) {
		d := d.in(t)
		ctl := func(root string) (string, int) {
			cmd := exec.Command(bothyBin, "ls")
			cmd.Env = append(os.Environ(), "BOTHY_URL="+d.URL, "BOTHY_ROOT="+root, "BOTHY_TOKEN_FILE=")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return stderr.String(), exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			return stderr.String(), 0
		}
		if stderr, code := ctl(d.Root); code != 0 {
			t.Fatalf("bothy with BOTHY_ROOT: exit %d: %s", code, stderr)
		}
		if stderr, code := ctl(t.TempDir()); code == 0 || !strings.Contains(stderr, "unauthorized") {
			t.Fatalf("bothy without a token: exit %d: %s", code, stderr)
		}
	})

	t.Run("another user cannot read it", func(t *testing.T) {
		requireRoot(t)
		// The state root of a test is in a private temporary directory anyway; open the way
		// to the file itself, so that only the file's own mode stands in the way.
		for p := filepath.Dir(d.Root); p != "/" && p != "."; p = filepath.Dir(p) {
			if strings.HasPrefix(p, os.TempDir()) && len(p) > len(os.TempDir()) {
				if err := os.Chmod(p, 0o755); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := os.Chmod(d.Root, 0o755); err != nil {
			t.Fatal(err)
		}
		cat := exec.Command("cat", path)
		cat.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cat.CombinedOutput(); err == nil || strings.Contains(string(out), d.Token) {
			t.Fatalf("nobody read the token file: %v %q", err, out)
		}
	})

	before := d.Token
	d.Restart(false)
	if d.Token != before {
		t.Fatalf("the token changed across a restart")
	}
	if r := d.do("GET", "/v1/sandboxes", nil, nil); r.Status != http.StatusOK {
		t.Fatalf("the kept token after a restart: %d %s", r.Status, r.Body)
	}

	open := startDaemon(t, withoutAuth())
	if r := open.do("GET", "/v1/sandboxes", nil, nil); r.Status != http.StatusOK || open.Token != "" {
		t.Fatalf("--insecure-no-auth: %d %s (token %q)", r.Status, r.Body, open.Token)
	}
	if _, err := os.Stat(filepath.Join(open.Root, "token")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("--insecure-no-auth generated a token anyway: %v", err)
	}
}

// TestAuthBeforeBody: clients without the token that declare a body and send one byte of it
// are each answered 401 while the rest of the body is still unsent, and closed, instead of
// holding their connections. (net/http read the rest of a small body before it answered.)
//
// The server gives a body a minute (server.DefaultBodyTimeout); the test's own limit is half
// that, so a 401 sent only when the body timed out fails too.
func TestAuthBeforeBody(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	addr := strings.TrimPrefix(d.URL, "http://")
	const clients = 50
	conns := make([]net.Conn, clients)
	for i := range conns {
		// Raw connections on purpose: each sends its headers and then stalls in its body,
		// which no http.Client can be made to do.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		head := "POST /v1/sandboxes HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n{"
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for i, c := range conns {
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("client %d, with its body unsent, got no answer: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		wantProblem(t, response{Status: resp.StatusCode, Header: resp.Header, Body: b}, http.StatusUnauthorized, "unauthorized")
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			t.Fatalf("client %d: the connection was not closed after the 401: %v", i, err)
		}
	}
}
