package e2b

import (
	"context"
	"errors"
	"io"
	iofs "io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/bothy/bothy/e2b/envd/filesystem"
	"github.com/bothy/bothy/e2b/envd/filesystem/filesystemconnect"
	"github.com/bothy/bothy/e2b/envd/process"
	"github.com/bothy/bothy/e2b/envd/process/processconnect"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// envdSupervisor adds to fakeSupervisor what the envd tests drive: writes (stored, with their
// metadata, as files StatFile finds), tracked input and watch starts, each recorded.
type envdSupervisor struct {
	*fakeSupervisor
	mu      sync.Mutex
	writes  []supervisor.WriteRequest
	inputs  []supervisor.TrackedInput
	watches []supervisor.WatchOptions
}

func (f *envdSupervisor) WriteFile(_ context.Context, _ string, req supervisor.WriteRequest, r io.Reader) (int64, error) {
	n, err := io.Copy(io.Discard, r)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, req)
	f.files[req.Path] = supervisor.FileInfo{Name: req.Path[strings.LastIndexByte(req.Path, '/')+1:], Type: supervisor.FileRegular, Size: n, Metadata: req.Metadata}
	return n, err
}

func (f *envdSupervisor) InputTracked(_ context.Context, _ string, pid int, _ string, in supervisor.TrackedInput) error {
	if pid != 7 {
		return errcode.Wrap(errcode.NotFound, supervisor.ErrNoProcess, "No tracked process with pid %d.", pid)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inputs = append(f.inputs, in)
	return nil
}

func (f *envdSupervisor) WatchDir(_ context.Context, _, _, _ string, opts supervisor.WatchOptions) (*supervisor.DirWatch, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.watches = append(f.watches, opts)
	return nil, errcode.New(errcode.InvalidRequest, "refused by the test")
}

func newEnvdServer(t *testing.T) (*httptest.Server, *envdSupervisor, http.Header) {
	t.Helper()
	h, f := newTestHandler(t)
	f.sandboxes["abc"] = &supervisor.Status{Config: supervisor.Config{ID: "abc"}, State: supervisor.StateRunning}
	es := &envdSupervisor{fakeSupervisor: f}
	h.sup = es
	// httptest's server speaks HTTP/1.1 alone, as bothyd's listener does to the SDKs.
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	hdr := http.Header{}
	hdr.Set(SandboxHeader, "abc")
	hdr.Set("X-Access-Token", h.accessToken("abc"))
	return srv, es, hdr
}

func TestUploadMetadata(t *testing.T) {
	t.Parallel()
	srv, f, hdr := newEnvdServer(t)
	post := func(meta map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/files?path=/home/user/m.txt", strings.NewReader("data"))
		req.Header = hdr.Clone()
		req.Header.Set("Content-Type", "application/octet-stream")
		for k, v := range meta {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post(map[string]string{"X-Metadata-Author": "ada", "x-metadata-Purpose": "test run", "X-Other": "not metadata"})
	if code != http.StatusOK || !strings.Contains(body, `"metadata":{"author":"ada","purpose":"test run"}`) {
		t.Fatalf("upload: %d %s", code, body)
	}
	if want := map[string]string{"author": "ada", "purpose": "test run"}; len(f.writes) != 1 || !maps.Equal(f.writes[0].Metadata, want) {
		t.Errorf("wrote %+v, want metadata %v", f.writes, want)
	}
	// Metadata beyond the bounds is a 400 in envd's form, and nothing is written.
	code, body = post(map[string]string{"X-Metadata-Big": strings.Repeat("v", 5000)})
	if code != http.StatusBadRequest || !strings.Contains(body, `"code":400`) {
		t.Errorf("too much metadata: %d %s", code, body)
	}
	if len(f.writes) != 1 {
		t.Errorf("a refused upload was written: %+v", f.writes)
	}
	// Stat answers the entry's details.
	fs := filesystemconnect.NewFilesystemClient(http.DefaultClient, srv.URL, connect.WithProtoJSON())
	req := connect.NewRequest(&filesystem.StatRequest{Path: "/home/user/m.txt"})
	maps.Copy(req.Header(), hdr)
	st, err := fs.Stat(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Msg.GetEntry().GetMetadata(); got["author"] != "ada" {
		t.Errorf("stat metadata %v", got)
	}
}

func TestEntryDetails(t *testing.T) {
	t.Parallel()
	e := entryOf("/d", supervisor.FileInfo{Name: "f", Type: supervisor.FileRegular, Mode: 0o640, Owner: "user", Group: "users", Metadata: map[string]string{"k": "v"}})
	if e.GetOwner() != "user" || e.GetGroup() != "users" || e.GetMetadata()["k"] != "v" || e.GetSymlinkTarget() != "" ||
		e.GetType() != filesystem.FileType_FILE_TYPE_FILE || e.GetPath() != "/d/f" || e.GetPermissions() != "-rw-r-----" {
		t.Errorf("file entry %v", e)
	}
	// A link is its target's type and mode, with its own permissions, as envd has it.
	e = entryOf("/d", supervisor.FileInfo{Name: "l", Type: supervisor.FileSymlink, Mode: 0o777, Target: "/d/sub", TargetType: supervisor.FileDir, TargetMode: 0o750})
	if e.GetSymlinkTarget() != "/d/sub" || e.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || e.GetMode() != 0o750|uint32(iofs.ModeDir) ||
		e.GetPermissions() != "Lrwxrwxrwx" {
		t.Errorf("link entry %v", e)
	}
	// A dangling one has no type; a FIFO neither.
	e = entryOf("/d", supervisor.FileInfo{Name: "l", Type: supervisor.FileSymlink, Mode: 0o777, Target: "/d/l"})
	if e.GetSymlinkTarget() != "/d/l" || e.GetType() != filesystem.FileType_FILE_TYPE_UNSPECIFIED {
		t.Errorf("dangling link entry %v", e)
	}
	if e := entryOf("/d", supervisor.FileInfo{Name: "p", Type: supervisor.FileOther}); e.GetType() != filesystem.FileType_FILE_TYPE_UNSPECIFIED {
		t.Errorf("fifo entry %v", e)
	}
}

// TestWatchNetworkMounts: envd's default refuses a directory on a network file system;
// allowNetworkMounts lifts that.
func TestWatchNetworkMounts(t *testing.T) {
	t.Parallel()
	srv, f, hdr := newEnvdServer(t)
	fs := filesystemconnect.NewFilesystemClient(http.DefaultClient, srv.URL, connect.WithProtoJSON())
	for _, allow := range []bool{false, true} {
		req := connect.NewRequest(&filesystem.WatchDirRequest{Path: "/tmp", AllowNetworkMounts: allow})
		maps.Copy(req.Header(), hdr)
		stream, err := fs.WatchDir(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for stream.Receive() {
		}
		if connect.CodeOf(stream.Err()) != connect.CodeInvalidArgument {
			t.Errorf("watch: %v, want the test's refusal", stream.Err())
		}
		stream.Close()
	}
	want := []supervisor.WatchOptions{{RefuseNetwork: true}, {RefuseNetwork: false}}
	if len(f.watches) != 2 || f.watches[0] != want[0] || f.watches[1] != want[1] {
		t.Errorf("watched with %+v, want %+v", f.watches, want)
	}
}

// TestStreamInput drives the client stream over HTTP/1.1 with connect-go's client: start,
// data, keepalive, data; then a stream whose data comes before its start.
func TestStreamInput(t *testing.T) {
	t.Parallel()
	srv, f, hdr := newEnvdServer(t)
	pc := processconnect.NewProcessClient(http.DefaultClient, srv.URL, connect.WithProtoJSON())
	send := func(evs ...*process.StreamInputRequest) error {
		stream := pc.StreamInput(context.Background())
		maps.Copy(stream.RequestHeader(), hdr)
		for _, ev := range evs {
			if err := stream.Send(ev); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
		}
		_, err := stream.CloseAndReceive()
		return err
	}
	start := &process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 7}}}}}
	data := func(s string) *process.StreamInputRequest {
		return &process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(s)}}}}}
	}
	keep := &process.StreamInputRequest{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}}
	if err := send(start, data("one "), keep, data("two")); err != nil {
		t.Fatal(err)
	}
	if len(f.inputs) != 2 || string(f.inputs[0].Stdin) != "one " || string(f.inputs[1].Stdin) != "two" {
		t.Errorf("inputs %+v", f.inputs)
	}
	if err := send(data("early")); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("data before start: %v", err)
	}
	other := &process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 8}}}}}
	if err := send(other, data("x")); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("input to no process: %v", err)
	}
}

// TestUnimplementedIsNotNotFound: a path of E2B's API that bothyd does not serve is 501,
// which the SDKs do not take for a missing sandbox.
func TestUnimplementedIsNotNotFound(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	f.sandboxes["abc"] = &supervisor.Status{Config: supervisor.Config{ID: "abc"}, State: supervisor.StateRunning}
	for _, target := range []string{"/sandboxes/abc/metrics", "/sandboxes/abc/snapshots", "/v2/sandboxes/abc/logs"} {
		w := do(t, h, http.MethodGet, target, "", apiKey)
		if w.Code != http.StatusNotImplemented || !strings.Contains(w.Body.String(), `"code":501`) {
			t.Errorf("%s: %d %s", target, w.Code, w.Body)
		}
	}
	if w := do(t, h, http.MethodGet, "/sandboxes/nope", "", apiKey); w.Code != http.StatusNotFound {
		t.Errorf("a missing sandbox: %d %s", w.Code, w.Body)
	}
}
