package tests

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestContractFiles: the file operations answer what the contract says of them. A non-empty
// directory is removed only with recursive=true; a directory read as a file
// (is-a-directory), and a non-empty one removed without recursive (directory-not-empty), are
// refused with field path; an empty file's
// Content-Length is 0; a write with parents=false into a missing directory is file-not-found
// that offers parents=true.
func TestContractFiles(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t)
	d.create("files", true)
	octet := http.Header{"Content-Type": {"application/octet-stream"}}

	if r := d.do("PUT", "/v1/sandboxes/files/files?path=/home/user/tree/sub/f", strings.NewReader("x"), octet); r.Status != 204 {
		t.Fatalf("write: %d %s", r.Status, r.Body)
	}
	p := wantProblem(t, d.do("DELETE", "/v1/sandboxes/files/files?path=/home/user/tree", nil, nil), 409, "directory-not-empty")
	if p.Field != "path" || !strings.Contains(p.Detail, "recursive=true") {
		t.Errorf("removing a non-empty directory: %+v, want field path and a hint of recursive=true", p)
	}
	if got := d.exec("files", map[string]any{"command": []string{"cat", "/home/user/tree/sub/f"}}); got.Stdout != "x" {
		t.Fatalf("a refused remove removed the tree: %+v", got)
	}
	if r := d.do("DELETE", "/v1/sandboxes/files/files?path=/home/user/tree&recursive=true", nil, nil); r.Status != 204 {
		t.Fatalf("recursive remove: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/files/files?path=/home/user/tree", nil, nil), 404, "file-not-found")

	p = wantProblem(t, d.do("GET", "/v1/sandboxes/files/files?path=/home/user", nil, nil), 409, "is-a-directory")
	if p.Field != "path" {
		t.Errorf("reading a directory as a file: field %q, want path", p.Field)
	}

	if r := d.do("PUT", "/v1/sandboxes/files/files?path=/home/user/empty", strings.NewReader(""), octet); r.Status != 204 {
		t.Fatalf("write an empty file: %d %s", r.Status, r.Body)
	}
	if r := d.do("GET", "/v1/sandboxes/files/files?path=/home/user/empty", nil, nil); r.Status != 200 || r.Header.Get("Content-Length") != "0" || len(r.Body) != 0 {
		t.Errorf("empty file read: %d, Content-Length %q, %d bytes; the contract says 0", r.Status, r.Header.Get("Content-Length"), len(r.Body))
	}

	p = wantProblem(t, d.do("PUT", "/v1/sandboxes/files/files?path=/home/user/none/f&parents=false", strings.NewReader("x"), octet), 404, "file-not-found")
	if p.Field != "path" || !strings.Contains(p.Detail, "parents=true") {
		t.Errorf("a write into a missing directory with parents=false: %+v", p)
	}
}

// TestContractRefusesUndocumentedInput: against the real binary, an unknown query parameter
// (the websocket's included, before any upgrade) and trailing data after a JSON body are
// refused with invalid-request naming what is at fault.
func TestContractRefusesUndocumentedInput(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	for _, target := range []string{
		"/v1/sandboxes?foo=bar",
		"/v1/sandboxes/nope/exec/stream?command=true&bogus=1",
		"/v1/info?foo=bar",
	} {
		p := wantProblem(t, d.do("GET", target, nil, nil), 400, "invalid-request")
		if p.Field != "foo" && p.Field != "bogus" {
			t.Errorf("GET %s: field %q, want the unknown parameter", target, p.Field)
		}
	}
	// force is a parameter of DELETE now (a forced delete); forcibly is not.
	p := wantProblem(t, d.do("DELETE", "/v1/sandboxes/nope?forcibly=true", nil, nil), 400, "invalid-request")
	if p.Field != "forcibly" {
		t.Errorf("DELETE ?forcibly=true: field %q, want forcibly", p.Field)
	}
	p = wantProblem(t, d.do("POST", "/v1/sandboxes", strings.NewReader(`{"id":"a"} {"start":true}`), nil), 400, "invalid-request")
	if p.Field != "body" {
		t.Errorf("two JSON values: field %q, want body", p.Field)
	}
	wantProblem(t, d.do("GET", "/v1/sandboxes/a", nil, nil), 404, "sandbox-not-found")
	for _, c := range []struct{ method, path string }{{"DELETE", "/"}, {"TRACE", "/metrics"}, {"POST", "/assets/app.js"}} {
		r := d.do(c.method, c.path, nil, nil)
		wantProblem(t, r, 405, "method-not-allowed")
		if r.Header.Get("Allow") != "GET" {
			t.Errorf("%s %s: Allow %q, want GET", c.method, c.path, r.Header.Get("Allow"))
		}
	}
}

// TestContractHTTPLayerRefusals: what the spec documents as the one exception to
// problem+json holds: a request that is not valid HTTP (a control byte in a header, headers
// over 1 MiB) is refused by Go's HTTP server before bothyd sees it, in plain text, with the
// connection closed. Raw connections on purpose: no http.Client sends such a request.
func TestContractHTTPLayerRefusals(t *testing.T) {
	t.Parallel()
	d := startDaemon(t)
	addr := strings.TrimPrefix(d.URL, "http://")
	for _, c := range []struct {
		name, header string
		status       int
	}{
		{"a control byte in a header", "X-Bad: a\x01b\r\n", 400},
		{"headers over 1 MiB", "X-Big: " + strings.Repeat("a", 1<<20+8192) + "\r\n", 431},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: "+addr+"\r\n"+c.header+"\r\n"); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp.Body.Close()
		conn.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != c.status || !strings.HasPrefix(ct, "text/plain") || !resp.Close {
			t.Errorf("%s: %d %q (close %v), want %d in plain text with the connection closed", c.name, resp.StatusCode, ct, resp.Close, c.status)
		}
	}
}
