package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/bothy/bothy/e2b"
	"github.com/bothy/bothy/e2b/envd/filesystem"
	"github.com/bothy/bothy/e2b/envd/filesystem/filesystemconnect"
	"github.com/bothy/bothy/e2b/envd/process"
	"github.com/bothy/bothy/e2b/envd/process/processconnect"
)

// longName is a name longer than the sandbox's file system holds (255 bytes), which the
// contract's path schema takes.
var longName = strings.Repeat("n", 300)

// prepareRefusals lays out, in a running sandbox, what each refusal of its files needs: a
// non-empty directory, a link loop, a link to a directory, and (as root) a file system mounted inside a tree the
// user owns. It reports whether the mount was made (a kernel may refuse a sandbox's mount).
func prepareRefusals(t *testing.T, d *daemon, id string) (mounted bool) {
	t.Helper()
	if got := d.exec(id, map[string]any{"command": []string{"sh", "-c",
		"mkdir -p /tmp/full/in /tmp/tree/m && ln -s loop /tmp/loop && ln -s /tmp/full /tmp/dirlink"}}); got.ExitCode != 0 {
		t.Fatalf("setting up: %+v", got)
	}
	got := d.exec(id, map[string]any{"user": "root", "command": []string{"mount", "-t", "tmpfs", "none", "/tmp/tree/m"}})
	if got.ExitCode != 0 {
		t.Logf("mounting inside the sandbox failed (%q): mount-inside is not checked here", got.Stderr)
	}
	return got.ExitCode == 0
}

// TestFileRefusalCodes (issue 38): what a sandbox's files refuse of a request the contract
// takes has a code and a status of its own, never 400 invalid-request, and names the field
// whose path was refused; an exec's cwd likewise, and a command the user may not execute
// exits 126 as a shell answers it.
func TestFileRefusalCodes(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("refusals", true)
	mounted := prepareRefusals(t, d, "refusals")
	octet := http.Header{"Content-Type": {"application/octet-stream"}}
	files := "/v1/sandboxes/refusals/files"

	cases := []struct {
		name, method, target string
		status               int
		code                 string
	}{
		{"read a directory", "GET", files + "?path=/tmp", 409, "is-a-directory"},
		{"write over a directory", "PUT", files + "?path=/tmp/full", 409, "is-a-directory"},
		{"read a device", "GET", files + "?path=/dev/null", 409, "not-a-regular-file"},
		{"list a file", "GET", files + "/list?path=/etc/passwd", 409, "not-a-directory"},
		{"a file as a parent", "GET", files + "?path=/etc/passwd/x", 409, "not-a-directory"},
		{"read under root's home", "GET", files + "?path=/root/x", 403, "permission-denied"},
		{"write in /etc", "PUT", files + "?path=/etc/bothy-refused&parents=false", 403, "permission-denied"},
		{"a parent the user may not make", "PUT", files + "?path=/bothy-refused/f", 403, "permission-denied"},
		{"remove root's file", "DELETE", files + "?path=/etc/passwd", 403, "permission-denied"},
		{"remove a non-empty directory", "DELETE", files + "?path=/tmp/full", 409, "directory-not-empty"},
		{"a link loop", "GET", files + "?path=/tmp/loop", 409, "symlink-loop"},
		{"a name too long", "GET", files + "?path=/tmp/" + longName, 422, "name-too-long"},
		{"write a name too long", "PUT", files + "?path=/tmp/" + longName, 422, "name-too-long"},
	}
	if mounted {
		cases = append(cases, struct {
			name, method, target string
			status               int
			code                 string
		}{"a mount inside a tree", "DELETE", files + "?path=/tmp/tree&recursive=true", 409, "mount-inside"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r response
			if c.method == "PUT" {
				r = d.in(t).do(c.method, c.target, strings.NewReader("x"), octet)
			} else {
				r = d.in(t).do(c.method, c.target, nil, nil)
			}
			if p := wantProblem(t, r, c.status, c.code); p.Field != "path" {
				t.Errorf("field %q, want path: %s", p.Field, r.Body)
			}
		})
	}
	if got := d.exec("refusals", map[string]any{"command": []string{"test", "-e", "/tmp/full/in"}}); got.ExitCode != 0 {
		t.Errorf("a refused removal removed the directory's entries: %+v", got)
	}

	t.Run("exec cwd", func(t *testing.T) {
		d := d.in(t)
		for _, c := range []struct {
			cwd    string
			status int
			code   string
		}{
			{"/nonexistent", 404, "file-not-found"},
			{"/etc/passwd", 409, "not-a-directory"},
			{"/root", 403, "permission-denied"},
			{"/tmp/" + longName, 422, "name-too-long"},
		} {
			p := wantProblem(t, d.doJSON("POST", "/v1/sandboxes/refusals/exec", map[string]any{"command": []string{"true"}, "cwd": c.cwd}), c.status, c.code)
			if p.Field != "cwd" {
				t.Errorf("cwd %s: field %q, want cwd", c.cwd, p.Field)
			}
			// The stream refuses it before the upgrade, as the buffered exec does.
			_, resp, err := d.dialStream("refusals", url.Values{"command": {"true"}, "cwd": {c.cwd}})
			if err == nil || resp == nil {
				t.Fatalf("cwd %s: the stream was upgraded", c.cwd)
			}
			var buf bytes.Buffer
			_, _ = buf.ReadFrom(resp.Body)
			resp.Body.Close()
			if p := wantProblem(t, response{Status: resp.StatusCode, Header: resp.Header, Body: buf.Bytes()}, c.status, c.code); p.Field != "cwd" {
				t.Errorf("stream cwd %s: field %q, want cwd", c.cwd, p.Field)
			}
		}
		if got := d.exec("refusals", map[string]any{"command": []string{"true"}, "cwd": "/root", "user": "root"}); got.ExitCode != 0 {
			t.Errorf("root in its own home: %+v", got)
		}
	})

	t.Run("a command the user may not execute", func(t *testing.T) {
		got := d.in(t).exec("refusals", map[string]any{"command": []string{"/etc/passwd"}})
		if got.ExitCode != 126 || !strings.Contains(got.Stderr, "may not be executed") {
			t.Errorf("executing /etc/passwd: %+v, want exit 126 and why on stderr", got)
		}
		if got := d.in(t).exec("refusals", map[string]any{"command": []string{"/no/such/program"}}); got.ExitCode != 127 {
			t.Errorf("a missing command: %+v, want exit 127", got)
		}
	})
}

// TestFileRefusalsThroughE2B (issue 38): E2B's envd API answers the same refusals as envd
// answers the same case, so that E2B's SDKs raise what they raise against E2B: a directory
// read as a file is HTTP 400 (InvalidArgumentError), a listing of a file and a Start in a
// cwd that does not exist invalid_argument, a link loop failed_precondition; a path the user
// may not access, which envd (acting as root) has no answer for, is 403 / permission_denied.
func TestFileRefusalsThroughE2B(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("e2bref", true)
	prepareRefusals(t, d, "e2bref")
	envd := http.Header{e2b.SandboxHeader: {"e2bref"}, "X-Access-Token": {envdAccessToken(d.Token, "e2bref")}}

	files := func(path string) (int, string) {
		req, err := http.NewRequest("GET", d.URL+"/files?path="+url.QueryEscape(path), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = envd.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Code != resp.StatusCode || body.Message == "" {
			t.Errorf("GET /files?path=%s: %d, body %+v (%v), want envd's {code, message}", path, resp.StatusCode, body, err)
		}
		return resp.StatusCode, body.Message
	}
	for _, c := range []struct {
		path   string
		status int
	}{
		{"/tmp", 400},                    // envd: "path ... is a directory"
		{"/etc/passwd/x", 400},           // not a directory
		{"/tmp/" + longName, 400},        // a name too long
		{"/root/x", 403},                 // the user may not
		{"/tmp/loop", 409},               // a link loop
		{"/tmp/no-such-file", 404},       // as before
		{"full/in", 404},                 // relative to the user's home: /home/user/full/in
		{"/tmp/full/in/../../full", 400}, // a directory, however named
	} {
		if status, msg := files(c.path); status != c.status {
			t.Errorf("GET /files?path=%s: %d (%s), want %d", c.path, status, msg, c.status)
		}
	}

	withHeaders := func(r connect.AnyRequest) {
		for k, v := range envd {
			r.Header()[k] = v
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fs := filesystemconnect.NewFilesystemClient(http.DefaultClient, d.URL, connect.WithProtoJSON())
	for _, c := range []struct {
		path string
		code connect.Code
	}{
		{"/etc/passwd", connect.CodeInvalidArgument}, // envd: "path is not a directory"
		{"/root/x", connect.CodePermissionDenied},
		{"/tmp/loop", connect.CodeFailedPrecondition}, // envd: "cyclic symlink"
		{"/tmp/" + longName, connect.CodeInvalidArgument},
	} {
		req := connect.NewRequest(&filesystem.ListDirRequest{Path: c.path})
		withHeaders(req)
		if _, err := fs.ListDir(ctx, req); connect.CodeOf(err) != c.code {
			t.Errorf("ListDir %s: %v, want %v", c.path, err, c.code)
		}
	}

	// A link to a directory lists as the directory, as envd follows it; its entries' paths
	// are under the link.
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: "/tmp/dirlink"})
	withHeaders(req)
	if resp, err := fs.ListDir(ctx, req); err != nil || len(resp.Msg.GetEntries()) != 1 || resp.Msg.GetEntries()[0].GetPath() != "/tmp/dirlink/in" {
		t.Errorf("ListDir of a link to a directory: %v %v, want its one entry under the link", resp, err)
	}

	procs := processconnect.NewProcessClient(http.DefaultClient, d.URL, connect.WithProtoJSON())
	for _, cwd := range []string{"/nonexistent", "/etc/passwd", "/root"} {
		req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "true", Cwd: &cwd}})
		withHeaders(req)
		stream, err := procs.Start(ctx, req)
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
			stream.Close()
		}
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.Contains(ce.Message(), cwd) {
			t.Errorf("Start in %s: %v, want invalid_argument naming the cwd, as envd answers a cwd that does not exist", cwd, err)
		}
	}
}
