package handlers

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/server"
	"github.com/bothy/bothy/supervisor"
)

// fakeSupervisor records what the handlers ask of it and answers what a test set. Every
// method a test did not prepare answers errUnprepared, so that a handler calling more than
// the test expects fails loudly.
type fakeSupervisor struct {
	mu sync.Mutex

	// Recorded requests.
	created   []supervisor.CreateRequest
	started   []string
	admitted  []admitCall
	runs      []runCall
	execs     []supervisor.ExecRequest
	writes    []supervisor.WriteRequest
	removes   []string
	listPaths []string
	deleted   []deleteCall
	lifetimes []*supervisor.Lifetime

	// Answers.
	status    map[string]*supervisor.Status
	list      []*supervisor.Status
	admitErr  error
	runResult *supervisor.ExecResult
	runErr    error
	startErr  error // StartExec's
	files     []supervisor.FileInfo
	templates []supervisor.Template
	gens      []supervisor.Generation
	leases    []supervisor.Lease
	outcome   supervisor.RetireOutcome
	images    []string
	err       error // the answer of the template and file operations, when set
}

var errUnprepared = errcode.New(errcode.Internal, "The fake supervisor was not prepared for this call.")

type admitCall struct {
	id   string
	wait time.Duration
}

type deleteCall struct {
	id    string
	force bool
}

type runCall struct {
	req   supervisor.ExecRequest
	stdin string
}

var _ Supervisor = (*fakeSupervisor)(nil)

func (f *fakeSupervisor) Create(_ context.Context, req supervisor.CreateRequest) (*supervisor.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, req)
	if f.err != nil {
		return nil, f.err
	}
	cfg := supervisor.Config{ID: req.ID, Image: req.Image, Resources: req.Resources, DiskMB: req.DiskMB, Env: req.Env, Labels: req.Labels}
	if cfg.Image == "" {
		cfg.Image = supervisor.HostImage
	}
	kind := req.Runtime
	if kind == "" {
		kind = "namespace"
	}
	if req.Start {
		// The supervisor starts what it created, under the same lock.
		f.started = append(f.started, req.ID)
		return &supervisor.Status{Config: cfg, State: supervisor.StateRunning, Runtime: kind}, nil
	}
	return &supervisor.Status{Config: cfg, State: supervisor.StateProvisioned, Runtime: kind}, nil
}

func (f *fakeSupervisor) Status(id string) (*supervisor.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.status[id]; ok {
		return st, nil
	}
	return nil, errcode.New(errcode.SandboxNotFound, "There is no sandbox %s.", id)
}

func (f *fakeSupervisor) List() ([]*supervisor.Status, error) { return f.list, nil }

func (f *fakeSupervisor) ListPage(after string, n int, keep func(*supervisor.Status) bool) ([]*supervisor.Status, bool, error) {
	sorted := slices.Clone(f.list)
	slices.SortFunc(sorted, func(a, b *supervisor.Status) int { return strings.Compare(a.Config.ID, b.Config.ID) })
	var page []*supervisor.Status
	for _, st := range sorted {
		if st.Config.ID <= after || !keep(st) {
			continue
		}
		if len(page) == n {
			return page, true, nil
		}
		page = append(page, st)
	}
	return page, false, nil
}

func (f *fakeSupervisor) Start(_ context.Context, id string) (*supervisor.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started = append(f.started, id)
	return &supervisor.Status{Config: supervisor.Config{ID: id}, State: supervisor.StateRunning}, nil
}

func (f *fakeSupervisor) Stop(context.Context, string, bool) (*supervisor.Status, error) {
	return nil, errUnprepared
}
func (f *fakeSupervisor) Deprovision(context.Context, string) error { return errUnprepared }

func (f *fakeSupervisor) Delete(_ context.Context, id string, force bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, deleteCall{id, force})
	if f.err != nil {
		return f.err
	}
	delete(f.status, id)
	return nil
}

func (f *fakeSupervisor) Pause(_ context.Context, id string) (*supervisor.Status, error) {
	return f.setState(id, supervisor.StatePaused)
}

func (f *fakeSupervisor) PauseReleasing(_ context.Context, id string) (*supervisor.Status, error) {
	return f.setState(id, supervisor.StatePaused)
}

func (f *fakeSupervisor) Resume(_ context.Context, id string) (*supervisor.Status, error) {
	return f.setState(id, supervisor.StateRunning)
}

// setState moves a prepared sandbox to state, as a pause or resume does.
func (f *fakeSupervisor) setState(id string, state supervisor.State) (*supervisor.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	st, ok := f.status[id]
	if !ok {
		return nil, errUnprepared
	}
	next := *st
	next.State = state
	f.status[id] = &next
	return &next, nil
}

func (f *fakeSupervisor) SetTimeout(_ context.Context, id string, lt *supervisor.Lifetime) (*supervisor.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lifetimes = append(f.lifetimes, lt)
	st, ok := f.status[id]
	if !ok {
		return nil, errUnprepared
	}
	return st, nil
}
func (f *fakeSupervisor) Logs(string, int) ([]byte, error) { return nil, errUnprepared }
func (f *fakeSupervisor) Images() ([]string, error)        { return f.images, nil }
func (f *fakeSupervisor) RuntimeInfo() supervisor.RuntimeInfo {
	return supervisor.RuntimeInfo{Kind: "namespace", Identity: "namespace/test", Runtimes: []supervisor.RuntimeStatus{
		{Kind: "namespace", Identity: "namespace/test", Default: true, State: supervisor.RuntimeReady},
		{Kind: "microvm", State: supervisor.RuntimeUnavailable, Reason: "missing qemu-system-x86_64"},
	}}
}

func (f *fakeSupervisor) AdmitExec(_ context.Context, id string, wait time.Duration) (*supervisor.Admission, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.admitted = append(f.admitted, admitCall{id, wait})
	if f.admitErr != nil {
		return nil, f.admitErr
	}
	// A zero admission holds no lock; Release is a no-op on it.
	return &supervisor.Admission{}, nil
}

func (f *fakeSupervisor) RunExec(_ context.Context, _ *supervisor.Admission, req supervisor.ExecRequest, stdin io.Reader) (*supervisor.ExecResult, error) {
	var in string
	if stdin != nil {
		b, _ := io.ReadAll(stdin)
		in = string(b)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs = append(f.runs, runCall{req, in})
	if f.runResult == nil && f.runErr == nil {
		return nil, errUnprepared
	}
	return f.runResult, f.runErr
}

func (f *fakeSupervisor) StartExec(_ context.Context, _ *supervisor.Admission, req supervisor.ExecRequest) (*supervisor.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execs = append(f.execs, req)
	if f.startErr != nil {
		return nil, f.startErr
	}
	return nil, errUnprepared
}

func (f *fakeSupervisor) ListFiles(_ context.Context, _, path, user string) ([]supervisor.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listPaths = append(f.listPaths, path+" as "+user)
	return f.files, f.err
}

func (f *fakeSupervisor) ReadFile(context.Context, string, string, string) (io.ReadCloser, int64, error) {
	if f.err != nil {
		return nil, 0, f.err
	}
	return io.NopCloser(strings.NewReader("hello")), 5, nil
}

func (f *fakeSupervisor) WriteFile(_ context.Context, _ string, req supervisor.WriteRequest, r io.Reader) (int64, error) {
	n, _ := io.Copy(io.Discard, r)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, req)
	return n, f.err
}

func (f *fakeSupervisor) RemoveFile(_ context.Context, _, path, user string, recursive bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if recursive {
		path += " recursively"
	}
	f.removes = append(f.removes, path+" as "+user)
	return f.err
}

func (f *fakeSupervisor) CreateTemplate(_ context.Context, name string) (*supervisor.Template, error) {
	if f.err != nil {
		return nil, f.err
	}
	return &supervisor.Template{Name: name}, nil
}

func (f *fakeSupervisor) ListTemplates() ([]supervisor.Template, error) { return f.templates, f.err }

func (f *fakeSupervisor) Template(name string) (*supervisor.Template, error) {
	if f.err != nil {
		return nil, f.err
	}
	for i := range f.templates {
		if f.templates[i].Name == name {
			return &f.templates[i], nil
		}
	}
	return nil, errcode.New(errcode.TemplateNotFound, "There is no template %s.", name)
}

func (f *fakeSupervisor) DeleteTemplate(context.Context, string, bool) (supervisor.RetireOutcome, error) {
	return f.outcome, f.err
}

func (f *fakeSupervisor) Capture(context.Context, string, string) (*supervisor.Generation, error) {
	return nil, errUnprepared
}

func (f *fakeSupervisor) PushState(string, string) (supervisor.PushState, bool) {
	return supervisor.PushState{}, false
}

func (f *fakeSupervisor) ListGenerations(string) ([]supervisor.Generation, error) {
	return f.gens, f.err
}

func (f *fakeSupervisor) Generation(_, gen string) (*supervisor.Generation, error) {
	if f.err != nil {
		return nil, f.err
	}
	for i := range f.gens {
		if f.gens[i].ID == gen {
			return &f.gens[i], nil
		}
	}
	return nil, errcode.New(errcode.GenerationNotFound, "There is no generation %s.", gen)
}

func (f *fakeSupervisor) Tombstone(context.Context, string, string) (*supervisor.Generation, error) {
	return nil, errUnprepared
}

func (f *fakeSupervisor) Retire(context.Context, string, string, bool) (supervisor.RetireOutcome, error) {
	return f.outcome, f.err
}

func (f *fakeSupervisor) Leases(string, string) ([]supervisor.Lease, error) { return f.leases, f.err }

// testDefaults are the create defaults the tests' handlers have.
var testDefaults = supervisor.Resources{VCPUs: 1, MemoryMB: 512, Pids: 256}

// newTestHandlers returns handlers on f, and the execs they reported to OnExec.
func newTestHandlers(t *testing.T, f *fakeSupervisor) (*Handlers, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var execs []string
	h, err := New(Config{
		Supervisor:       f,
		DefaultResources: testDefaults,
		DefaultDiskMB:    0,
		Version:          "test",
		MaxGenerationAge: time.Hour,
		OnExec: func(mode string, _ time.Duration, timedOut bool, err error) {
			mu.Lock()
			defer mu.Unlock()
			execs = append(execs, mode+" "+string(errcode.Of(err))+map[bool]string{true: " timed-out"}[timedOut])
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return h, &execs
}

// newTestServer serves h as bothyd does: the contract's validation and the one error
// mapper in front of the handlers.
func newTestServer(t testing.TB, h *Handlers) *server.Server {
	t.Helper()
	s, err := server.New(server.Config{Handlers: h, ExecStream: h.ExecStream, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// problem is the part of a problem response the tests look at.
type problem struct {
	Code   string `json:"code"`
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// newRequest is a request to the server under test, with a JSON body if body is set.
func newRequest(method, target, body string, header ...string) *http.Request {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, "http://127.0.0.1"+target, r)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// serve serves one request.
func serve(s http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

// do sends one request to s and returns the response's status and body.
func do(t *testing.T, s http.Handler, method, target, body string, header ...string) (int, []byte) {
	t.Helper()
	rec := serve(s, newRequest(method, target, body, header...))
	return rec.Code, rec.Body.Bytes()
}

// problemOf decodes a problem response.
func problemOf(t *testing.T, body []byte) problem {
	t.Helper()
	var p problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("not a problem response: %v: %s", err, body)
	}
	return p
}
