package handlers

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// TestFileList: a listing acts as the sandbox's user, names each type as the contract does,
// shows modes in octal with their special bits, and stops at maxListEntries.
func TestFileList(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	files := []supervisor.FileInfo{
		{Name: "f", Type: supervisor.FileRegular, Size: 3, Mode: 0o644, ModifiedAt: at},
		{Name: "d", Type: supervisor.FileDir, Mode: 0o1777},
		{Name: "l", Type: supervisor.FileSymlink, Mode: 0o777},
		{Name: "p", Type: supervisor.FileOther, Mode: 0o4755},
	}
	for len(files) < maxListEntries+5 {
		files = append(files, supervisor.FileInfo{Name: "x", Type: supervisor.FileRegular})
	}
	f := &fakeSupervisor{files: files}
	h, _ := newTestHandlers(t, f)
	code, body := do(t, newTestServer(t, h), "GET", "/v1/sandboxes/a1/files/list?path=/home/user", "")
	var l openapi.FileList
	if err := json.Unmarshal(body, &l); err != nil || code != http.StatusOK {
		t.Fatalf("%d %.200s", code, body)
	}
	if len(l.Items) != maxListEntries {
		t.Errorf("%d entries, want the cap %d", len(l.Items), maxListEntries)
	}
	want := []openapi.FileEntry{
		{Name: "f", Type: openapi.FileEntryTypeFile, Size: 3, Mode: "0644", ModifiedAt: at},
		{Name: "d", Type: openapi.FileEntryTypeDirectory, Mode: "1777"},
		{Name: "l", Type: openapi.FileEntryTypeSymlink, Mode: "0777"},
		{Name: "p", Type: openapi.FileEntryTypeOther, Mode: "4755"},
	}
	for i, w := range want {
		if g := l.Items[i]; g.Name != w.Name || g.Type != w.Type || g.Size != w.Size || g.Mode != w.Mode || !g.ModifiedAt.Equal(w.ModifiedAt) {
			t.Errorf("entry %d: %+v, want %+v", i, g, w)
		}
	}
	if !slices.Equal(f.listPaths, []string{"/home/user as user"}) {
		t.Errorf("listed %q", f.listPaths)
	}
}

// TestFileWriteReadRemove: a write makes its parents and a 0644 file as the sandbox's user, a
// read streams the content with its length, a remove is recursive when asked to be, and only
// then.
func TestFileWriteReadRemove(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{}
	h, _ := newTestHandlers(t, f)
	s := newTestServer(t, h)
	req := newRequest("PUT", "/v1/sandboxes/a1/files?path=/home/user/a/b.txt", "")
	req.Body = http.NoBody
	req.Header.Set("Content-Type", "application/octet-stream")
	if rec := serve(s, req); rec.Code != http.StatusNoContent {
		t.Fatalf("write: %d %s", rec.Code, rec.Body)
	}
	if want := (supervisor.WriteRequest{Path: "/home/user/a/b.txt", User: "user", Mode: 0o644, MakeParents: true}); len(f.writes) != 1 || !reflect.DeepEqual(f.writes[0], want) {
		t.Errorf("wrote %+v, want %+v", f.writes, want)
	}
	rec := serve(s, newRequest("GET", "/v1/sandboxes/a1/files?path=/home/user/a/b.txt", ""))
	if rec.Code != http.StatusOK || rec.Body.String() != "hello" || rec.Header().Get("Content-Length") != "5" {
		t.Errorf("read: %d %q, length %q", rec.Code, rec.Body, rec.Header().Get("Content-Length"))
	}
	if code, body := do(t, s, "DELETE", "/v1/sandboxes/a1/files?path=/home/user/a&recursive=true", ""); code != http.StatusNoContent {
		t.Errorf("remove: %d %s", code, body)
	}
	if code, body := do(t, s, "DELETE", "/v1/sandboxes/a1/files?path=/home/user/b", ""); code != http.StatusNoContent {
		t.Errorf("remove: %d %s", code, body)
	}
	if !slices.Equal(f.removes, []string{"/home/user/a recursively as user", "/home/user/b as user"}) {
		t.Errorf("removed %q", f.removes)
	}
}

// TestFileRefusals: the supervisor's answers pass through the error mapper unchanged.
func TestFileRefusals(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{err: errcode.New(errcode.NotRunning, "Sandbox a1 is stopped; start it first.")}
	h, _ := newTestHandlers(t, f)
	s := newTestServer(t, h)
	for _, target := range []string{"/v1/sandboxes/a1/files?path=/x", "/v1/sandboxes/a1/files/list?path=/x"} {
		code, body := do(t, s, "GET", target, "")
		if p := problemOf(t, body); code != http.StatusConflict || p.Code != string(errcode.NotRunning) {
			t.Errorf("%s: %d %+v, want 409 not-running", target, code, p)
		}
	}
	code, body := do(t, s, "GET", "/v1/sandboxes/a1/files?path=relative", "")
	if p := problemOf(t, body); code != http.StatusBadRequest || p.Field != "path" {
		t.Errorf("a relative path: %d %+v, want invalid-request on path", code, p)
	}
}

// TestFileRefusalsNamePath: the agent's refusals of a path (a directory read as a file, a
// non-empty directory removed without recursive=true) come back with field path, and a write
// with parents=false into a missing directory says so and offers parents=true.
func TestFileRefusalsNamePath(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{err: errcode.New(errcode.InvalidRequest, "\"/home/user\" is a directory.")}
	h, _ := newTestHandlers(t, f)
	s := newTestServer(t, h)
	for _, c := range []struct{ method, target string }{
		{"GET", "/v1/sandboxes/a1/files?path=/home/user"},
		{"DELETE", "/v1/sandboxes/a1/files?path=/home/user"},
	} {
		code, body := do(t, s, c.method, c.target, "")
		if p := problemOf(t, body); code != http.StatusBadRequest || p.Field != "path" {
			t.Errorf("%s %s: %d %+v, want invalid-request on path", c.method, c.target, code, p)
		}
	}

	f = &fakeSupervisor{err: errcode.New(errcode.FileNotFound, "\"/no/dir/f\" does not exist inside the sandbox.")}
	h, _ = newTestHandlers(t, f)
	s = newTestServer(t, h)
	req := newRequest("PUT", "/v1/sandboxes/a1/files?path=/no/dir/f&parents=false", "")
	req.Body = http.NoBody
	req.Header.Set("Content-Type", "application/octet-stream")
	rec := serve(s, req)
	if p := problemOf(t, rec.Body.Bytes()); rec.Code != http.StatusNotFound || p.Field != "path" || !strings.Contains(p.Detail, "parents=true") || !strings.Contains(p.Detail, `"/no/dir",`) {
		t.Errorf("a write into a missing directory with parents=false: %d %+v", rec.Code, p)
	}
	if len(f.writes) != 1 || f.writes[0].MakeParents {
		t.Errorf("parents=false still makes parents: %+v", f.writes)
	}
}
