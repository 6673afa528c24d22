package e2b

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

const testToken = "0123456789abcdef0123456789abcdef"

// fakeSupervisor knows sandboxes by id and records the creates it sees; it runs nothing.
type fakeSupervisor struct {
	Supervisor // unset methods panic: a test that reaches one is wrong
	sandboxes  map[string]*supervisor.Status
	templates  map[string]bool
	created    []supervisor.CreateRequest
	files      map[string]supervisor.FileInfo
}

func (f *fakeSupervisor) Create(_ context.Context, req supervisor.CreateRequest) (*supervisor.Status, error) {
	f.created = append(f.created, req)
	st := &supervisor.Status{Config: supervisor.Config{ID: req.ID, Image: req.Image, Labels: req.Labels}, State: supervisor.StateRunning}
	f.sandboxes[req.ID] = st
	return st, nil
}

func (f *fakeSupervisor) Status(id string) (*supervisor.Status, error) {
	if st, ok := f.sandboxes[id]; ok {
		return st, nil
	}
	return nil, errcode.New(errcode.SandboxNotFound, "There is no sandbox %s.", id)
}

func (f *fakeSupervisor) List() ([]*supervisor.Status, error) {
	var out []*supervisor.Status
	for _, st := range f.sandboxes {
		out = append(out, st)
	}
	return out, nil
}

func (f *fakeSupervisor) Delete(_ context.Context, id string, _ bool) error {
	if _, ok := f.sandboxes[id]; !ok {
		return errcode.New(errcode.SandboxNotFound, "There is no sandbox %s.", id)
	}
	delete(f.sandboxes, id)
	return nil
}

func (f *fakeSupervisor) Template(name string) (*supervisor.Template, error) {
	if f.templates[name] {
		return &supervisor.Template{}, nil
	}
	return nil, errcode.New(errcode.TemplateNotFound, "There is no template %s.", name)
}

func (f *fakeSupervisor) StatFile(_ context.Context, _, path, _ string) (supervisor.FileInfo, error) {
	if fi, ok := f.files[path]; ok {
		return fi, nil
	}
	return supervisor.FileInfo{}, errcode.New(errcode.FileNotFound, "There is no file %s.", path)
}

func (f *fakeSupervisor) MakeDir(context.Context, string, string, string, fs.FileMode, bool) error {
	return errors.New("unreachable in these tests")
}

// AttachTracked finds no process: the agent answers so for a pid that runs nothing.
func (f *fakeSupervisor) AttachTracked(_ context.Context, _ string, pid int, _ string, _ bool) (*supervisor.Attachment, error) {
	return nil, errcode.Wrap(errcode.NotFound, supervisor.ErrNoProcess, "No tracked process with pid %d runs in the sandbox.", pid)
}

func newTestHandler(t *testing.T) (*Handler, *fakeSupervisor) {
	t.Helper()
	f := &fakeSupervisor{sandboxes: map[string]*supervisor.Status{}, templates: map[string]bool{"py": true}, files: map[string]supervisor.FileInfo{}}
	return New(Config{Supervisor: f, Token: testToken}), f
}

func do(t *testing.T, h http.Handler, method, target, body string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

var apiKey = map[string]string{"X-API-KEY": "e2b_" + testToken, "Content-Type": "application/json"}

func TestClaims(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path   string
		header bool
		want   bool
	}{
		{"/sandboxes", false, true},
		{"/sandboxes/abc/connect", false, true},
		{"/v2/sandboxes", false, true},
		{"/v1/sandboxes", false, false},
		{"/healthz", false, false},
		{"/sandboxesx", false, false},
		{"/files", false, false},
		{"/files", true, true},
		{"/health", true, true},
	} {
		r := httptest.NewRequest(http.MethodGet, tc.path, nil)
		if tc.header {
			r.Header.Set(SandboxHeader, "abc")
		}
		if got := Claims(r); got != tc.want {
			t.Errorf("Claims(%s, header %v) = %v, want %v", tc.path, tc.header, got, tc.want)
		}
	}
}

func TestAPIKey(t *testing.T) {
	t.Parallel()
	h, _ := newTestHandler(t)
	for key, want := range map[string]bool{
		testToken:          true,
		"e2b_" + testToken: true,
		"e2b_wrong":        false,
		"":                 false,
		"x" + testToken:    false,
	} {
		if got := h.apiKeyOK(key); got != want {
			t.Errorf("apiKeyOK(%q) = %v, want %v", key, got, want)
		}
	}
	w := do(t, h, http.MethodGet, "/v2/sandboxes", "", map[string]string{"X-API-KEY": "e2b_wrong"})
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), `"code":401`) {
		t.Errorf("a wrong key: %d %s", w.Code, w.Body)
	}
}

func TestCreateMapsTemplateMetadataTimeoutAndEnv(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	for _, tc := range []struct {
		name, body      string
		image, template string
		timeout         time.Duration
		onTimeout       supervisor.OnTimeout
	}{
		{"base", `{"templateID":"base"}`, "", "", defaultTimeout, supervisor.TimeoutDelete},
		{"template", `{"templateID":"py","timeout":60}`, "", "py", time.Minute, supervisor.TimeoutDelete},
		{"image", `{"templateID":"alpine","timeout":10,"autoPause":true}`, "alpine", "", 10 * time.Second, supervisor.TimeoutStop},
	} {
		w := do(t, h, http.MethodPost, "/v2/sandboxes", tc.body, apiKey)
		if w.Code != http.StatusCreated {
			t.Fatalf("%s: %d %s", tc.name, w.Code, w.Body)
		}
		var c created
		if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		req := f.created[len(f.created)-1]
		if !sandboxID.MatchString(c.SandboxID) || c.SandboxID != req.ID || !req.Start {
			t.Errorf("%s: id %q, request %+v", tc.name, c.SandboxID, req)
		}
		if c.EnvdVersion != EnvdVersion || c.EnvdAccessToken == "" || c.EnvdAccessToken != h.accessToken(c.SandboxID) {
			t.Errorf("%s: envd %q token %q", tc.name, c.EnvdVersion, c.EnvdAccessToken)
		}
		gotTemplate := ""
		if req.Clone != nil {
			gotTemplate = req.Clone.Template
		}
		if req.Image != tc.image || gotTemplate != tc.template {
			t.Errorf("%s: image %q template %q", tc.name, req.Image, gotTemplate)
		}
		if req.Lifetime == nil || req.Lifetime.Timeout != tc.timeout || req.Lifetime.OnTimeout != tc.onTimeout {
			t.Errorf("%s: lifetime %+v", tc.name, req.Lifetime)
		}
	}
	w := do(t, h, http.MethodPost, "/sandboxes", `{"templateID":"base","metadata":{"team":"a"},"envVars":{"K":"v"}}`, apiKey)
	req := f.created[len(f.created)-1]
	if w.Code != http.StatusCreated || req.Labels["team"] != "a" || req.Env["K"] != "v" {
		t.Errorf("metadata and env: %d %+v", w.Code, req)
	}
	w = do(t, h, http.MethodPost, "/sandboxes", `{"metadata":{"Bad Key":"a"}}`, apiKey)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"code":400`) {
		t.Errorf("a metadata key that is no label key: %d %s", w.Code, w.Body)
	}
}

func TestDeleteAnswersE2BCodes(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	f.sandboxes["abc"] = &supervisor.Status{Config: supervisor.Config{ID: "abc"}, State: supervisor.StateRunning}
	if w := do(t, h, http.MethodDelete, "/sandboxes/abc", "", apiKey); w.Code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	w := do(t, h, http.MethodDelete, "/sandboxes/abc", "", apiKey)
	var e apiError
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != http.StatusNotFound || e.Code != 404 {
		t.Errorf("a second delete: %d %s", w.Code, w.Body)
	}
}

// TestDetailLifecycle: GET /sandboxes/{id} reports the lifetime's end as endAt and what it
// does as E2B's lifecycle (kill for a delete, pause for a stop); a sandbox without a
// lifetime has no lifecycle and ends, for E2B's schema, at its start.
func TestDetailLifecycle(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	end := started.Add(time.Hour)
	for id, on := range map[string]supervisor.OnTimeout{"kill": supervisor.TimeoutDelete, "stop": supervisor.TimeoutStop, "none": ""} {
		st := &supervisor.Status{Config: supervisor.Config{ID: id}, State: supervisor.StateRunning, StartedAt: &started}
		if on != "" {
			st.ExpiresAt, st.OnTimeout = &end, on
		}
		f.sandboxes[id] = st
	}
	for _, tc := range []struct {
		id, onTimeout string
		endAt         time.Time
	}{{"kill", "kill", end}, {"stop", "pause", end}, {"none", "", started}} {
		w := do(t, h, http.MethodGet, "/sandboxes/"+tc.id, "", apiKey)
		var d struct {
			EndAt     time.Time `json:"endAt"`
			Lifecycle *struct {
				OnTimeout  string `json:"onTimeout"`
				AutoResume *bool  `json:"autoResume"`
			} `json:"lifecycle"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil || w.Code != http.StatusOK {
			t.Fatalf("detail of %s: %d %s", tc.id, w.Code, w.Body)
		}
		if !d.EndAt.Equal(tc.endAt) {
			t.Errorf("%s: endAt %v, want %v", tc.id, d.EndAt, tc.endAt)
		}
		switch {
		case tc.onTimeout == "" && d.Lifecycle != nil:
			t.Errorf("%s: lifecycle %+v, want none", tc.id, *d.Lifecycle)
		case tc.onTimeout != "" && (d.Lifecycle == nil || d.Lifecycle.OnTimeout != tc.onTimeout || d.Lifecycle.AutoResume == nil || *d.Lifecycle.AutoResume):
			t.Errorf("%s: lifecycle %s, want onTimeout %s and autoResume false", tc.id, w.Body, tc.onTimeout)
		}
	}
}

// pauseSupervisor records how a pause came through: frozen (Pause) or stopped (Stop).
type pauseSupervisor struct {
	*fakeSupervisor
	calls []string
}

func (f *pauseSupervisor) Pause(_ context.Context, id string) (*supervisor.Status, error) {
	f.calls = append(f.calls, "pause "+id)
	f.sandboxes[id].State = supervisor.StatePaused
	return f.sandboxes[id], nil
}

func (f *pauseSupervisor) Stop(_ context.Context, id string, force bool) (*supervisor.Status, error) {
	if force {
		return nil, errors.New("a pause stops gracefully")
	}
	f.calls = append(f.calls, "stop "+id)
	f.sandboxes[id].State = supervisor.StateStopped
	return f.sandboxes[id], nil
}

// TestPauseKeepsMemoryOrNot: E2B's pause freezes (memory kept, the default of both SDKs;
// Python sends memory true, JS nothing); memory false (keepMemory=False) stops the sandbox,
// keeping its file system alone; a sandbox E2B sees paused is 409, whichever way it paused.
func TestPauseKeepsMemoryOrNot(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	ps := &pauseSupervisor{fakeSupervisor: f}
	h.sup = ps
	for _, id := range []string{"a", "b", "c"} {
		f.sandboxes[id] = &supervisor.Status{Config: supervisor.Config{ID: id}, State: supervisor.StateRunning}
	}
	for _, tc := range []struct{ id, body string }{{"a", ""}, {"b", `{"memory":true}`}, {"c", `{"memory":false}`}} {
		if w := do(t, h, http.MethodPost, "/sandboxes/"+tc.id+"/pause", tc.body, apiKey); w.Code != http.StatusNoContent {
			t.Fatalf("pause %s with %q: %d %s", tc.id, tc.body, w.Code, w.Body)
		}
	}
	if want := []string{"pause a", "pause b", "stop c"}; !slices.Equal(ps.calls, want) {
		t.Errorf("calls %v, want %v", ps.calls, want)
	}
	for _, id := range []string{"a", "c"} {
		w := do(t, h, http.MethodPost, "/sandboxes/"+id+"/pause", `{"memory":false}`, apiKey)
		var e apiError
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != http.StatusConflict || e.Code != 409 {
			t.Errorf("a second pause of %s: %d %s, want 409", id, w.Code, w.Body)
		}
	}
	if w := do(t, h, http.MethodPost, "/sandboxes/a/pause", `{"memory":`, apiKey); w.Code != http.StatusBadRequest {
		t.Errorf("a malformed body: %d %s, want 400", w.Code, w.Body)
	}
	if len(ps.calls) != 3 {
		t.Errorf("calls %v after the refusals, want none more", ps.calls)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	for _, id := range []string{"a1", "a2", "a3", "b1"} {
		labels := map[string]string{"team": "x"}
		if id == "b1" {
			labels["team"] = "y"
		}
		f.sandboxes[id] = &supervisor.Status{Config: supervisor.Config{ID: id, Labels: labels}, State: supervisor.StateRunning}
	}
	f.sandboxes["with-dash"] = &supervisor.Status{Config: supervisor.Config{ID: "with-dash", Labels: map[string]string{"team": "x"}}, State: supervisor.StateRunning}
	f.sandboxes["p1"] = &supervisor.Status{Config: supervisor.Config{ID: "p1", Labels: map[string]string{"team": "x"}}, State: supervisor.StatePaused}

	meta := url.QueryEscape("team=x")
	var ids []string
	next := ""
	for range 10 {
		w := do(t, h, http.MethodGet, "/v2/sandboxes?state=running&limit=2&metadata="+meta+"&nextToken="+next, "", apiKey)
		if w.Code != http.StatusOK {
			t.Fatalf("list: %d %s", w.Code, w.Body)
		}
		var page []detailBody
		if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		for _, d := range page {
			ids = append(ids, d.SandboxID)
		}
		if next = w.Header().Get("X-Next-Token"); next == "" {
			break
		}
	}
	if got := strings.Join(ids, ","); got != "a1,a2,a3" {
		t.Errorf("running sandboxes of team x, two a page: %s", got)
	}
	w := do(t, h, http.MethodGet, "/v2/sandboxes?state=paused", "", apiKey)
	if !strings.Contains(w.Body.String(), `"sandboxID":"p1"`) || strings.Contains(w.Body.String(), `"a1"`) {
		t.Errorf("paused sandboxes: %s", w.Body)
	}
}

// envelope is one frame of a Connect stream: its flags and its message.
type envelope struct {
	flags byte
	data  []byte
}

// readEnvelopes splits a Connect stream body into its 5-byte-headed frames.
func readEnvelopes(t *testing.T, body []byte) []envelope {
	t.Helper()
	var out []envelope
	for len(body) > 0 {
		if len(body) < 5 {
			t.Fatalf("a frame header is cut short: %q", body)
		}
		n := binary.BigEndian.Uint32(body[1:5])
		if uint32(len(body)-5) < n {
			t.Fatalf("a frame of %d bytes has %d", n, len(body)-5)
		}
		out = append(out, envelope{flags: body[0], data: body[5 : 5+n]})
		body = body[5+n:]
	}
	return out
}

func TestConnectUnaryAndStreamFraming(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	f.sandboxes["abc"] = &supervisor.Status{Config: supervisor.Config{ID: "abc"}, State: supervisor.StateRunning}
	f.files["/home/user/x"] = supervisor.FileInfo{Name: "x", Type: supervisor.FileRegular, Size: 3, Mode: 0o644}
	f.files["/home/user/d"] = supervisor.FileInfo{Name: "d", Type: supervisor.FileDir, Mode: 0o755}
	envd := map[string]string{SandboxHeader: "abc", "X-Access-Token": h.accessToken("abc"), "Content-Type": "application/json"}

	// Unary, JSON codec: a plain JSON body each way, protojson's field names.
	w := do(t, h, http.MethodPost, "/filesystem.Filesystem/Stat", `{"path":"/home/user/x"}`, envd)
	var stat struct {
		Entry struct {
			Name, Type, Path, Permissions string
			Size                          string
		}
	}
	if err := json.Unmarshal(w.Body.Bytes(), &stat); err != nil || w.Code != http.StatusOK {
		t.Fatalf("Stat: %d %s", w.Code, w.Body)
	}
	if stat.Entry.Path != "/home/user/x" || stat.Entry.Type != "FILE_TYPE_FILE" || stat.Entry.Permissions != "-rw-r--r--" || stat.Entry.Size != "3" {
		t.Errorf("Stat: %s", w.Body)
	}
	w = do(t, h, http.MethodPost, "/filesystem.Filesystem/Stat", `{"path":"/nope"}`, envd)
	if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), `"code":"not_found"`) {
		t.Errorf("Stat of a missing file: %d %s", w.Code, w.Body)
	}
	w = do(t, h, http.MethodPost, "/filesystem.Filesystem/MakeDir", `{"path":"/home/user/d"}`, envd)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), `"code":"already_exists"`) {
		t.Errorf("MakeDir of a directory that exists: %d %s", w.Code, w.Body)
	}
	// A file in the way is envd's invalid_argument ("path already exists but it is not a
	// directory"), not already_exists, which the SDKs would answer as false.
	w = do(t, h, http.MethodPost, "/filesystem.Filesystem/MakeDir", `{"path":"/home/user/x"}`, envd)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), `"code":"invalid_argument"`) {
		t.Errorf("MakeDir of a file that exists: %d %s", w.Code, w.Body)
	}

	// A server stream, JSON codec: enveloped messages, then the end-of-stream frame (flag
	// 0x02) carrying the error of a process that is not there.
	var req bytes.Buffer
	msg := []byte(`{"process":{"pid":4242}}`)
	req.WriteByte(0)
	_ = binary.Write(&req, binary.BigEndian, uint32(len(msg)))
	req.Write(msg)
	envd["Content-Type"] = "application/connect+json"
	w = do(t, h, http.MethodPost, "/process.Process/Connect", req.String(), envd)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/connect+json" {
		t.Fatalf("Connect: %d %q", w.Code, w.Header().Get("Content-Type"))
	}
	frames := readEnvelopes(t, w.Body.Bytes())
	if len(frames) != 1 || frames[0].flags != 0x02 {
		t.Fatalf("Connect to no process: want one end-of-stream frame, got %+v", frames)
	}
	var end struct {
		Error struct{ Code string }
	}
	if err := json.Unmarshal(frames[0].data, &end); err != nil || end.Error.Code != "not_found" {
		t.Errorf("end-of-stream frame: %s", frames[0].data)
	}
}

func TestEnvdAccessToken(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	f.sandboxes["abc"] = &supervisor.Status{Config: supervisor.Config{ID: "abc"}, State: supervisor.StateRunning}
	f.sandboxes["def"] = &supervisor.Status{Config: supervisor.Config{ID: "def"}, State: supervisor.StateRunning}
	body := `{"path":"/"}`
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"its own", h.accessToken("abc"), http.StatusNotFound},
		{"another sandbox's", h.accessToken("def"), http.StatusUnauthorized},
		{"none", "", http.StatusUnauthorized},
	} {
		w := do(t, h, http.MethodPost, "/filesystem.Filesystem/Stat", body,
			map[string]string{SandboxHeader: "abc", "X-Access-Token": tc.token, "Content-Type": "application/json"})
		if w.Code != tc.want {
			t.Errorf("%s token: %d %s, want %d", tc.name, w.Code, w.Body, tc.want)
		}
	}
	if w := do(t, h, http.MethodGet, "/health", "", map[string]string{SandboxHeader: "abc"}); w.Code != http.StatusNoContent {
		t.Errorf("health: %d", w.Code)
	}
}

// TestHealthIsTheSandboxs: with its access token, /health says whether the sandbox runs, as
// E2B's edge does (502 when it does not: the SDKs' isRunning is then false, also after a
// kill); without it, it tells nothing of the sandbox.
func TestHealthIsTheSandboxs(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	f.sandboxes["run"] = &supervisor.Status{Config: supervisor.Config{ID: "run"}, State: supervisor.StateRunning}
	f.sandboxes["zzz"] = &supervisor.Status{Config: supervisor.Config{ID: "zzz"}, State: supervisor.StatePaused}
	f.sandboxes["off"] = &supervisor.Status{Config: supervisor.Config{ID: "off"}, State: supervisor.StateStopped}
	for _, tc := range []struct {
		id, token string
		want      int
	}{
		{"run", h.accessToken("run"), http.StatusNoContent},
		{"zzz", h.accessToken("zzz"), http.StatusBadGateway},
		{"off", h.accessToken("off"), http.StatusBadGateway},
		{"gone", h.accessToken("gone"), http.StatusBadGateway},
		{"gone", "", http.StatusNoContent},
		{"zzz", h.accessToken("run"), http.StatusNoContent},
	} {
		w := do(t, h, http.MethodGet, "/health", "", map[string]string{SandboxHeader: tc.id, "X-Access-Token": tc.token})
		if w.Code != tc.want {
			t.Errorf("health of %s (token %.8q): %d %s, want %d", tc.id, tc.token, w.Code, w.Body, tc.want)
		}
		if w.Code == http.StatusBadGateway {
			var e apiError
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code != http.StatusBadGateway {
				t.Errorf("health of %s: body %s, want E2B's error with code 502", tc.id, w.Body)
			}
		}
	}
}

// TestCreateMapsNetwork: E2B's internet switch and egress rules become bothyd's policy: none
// asked is no interface (bothyd's default); allowOut under a denied internet is the
// allow-list; denyOut under an open internet the deny list; an exception bothyd cannot say
// is refused naming the field.
func TestCreateMapsNetwork(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	for _, tc := range []struct {
		name, body string
		want       *supervisor.NetworkPolicy
	}{
		{"nothing asked", `{}`, nil},
		{"internet", `{"allow_internet_access":true}`, &supervisor.NetworkPolicy{Internet: true}},
		{"no internet", `{"allow_internet_access":false}`, nil},
		{"allow-list", `{"network":{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1","pypi.org"]}}`,
			&supervisor.NetworkPolicy{Allow: []string{"1.1.1.1", "pypi.org"}}},
		{"allow-list without internet", `{"allow_internet_access":false,"network":{"allowOut":["10.0.0.0/8"]}}`,
			&supervisor.NetworkPolicy{Allow: []string{"10.0.0.0/8"}}},
		{"deny list", `{"allow_internet_access":true,"network":{"denyOut":["10.0.0.0/8"]}}`,
			&supervisor.NetworkPolicy{Internet: true, Deny: []string{"10.0.0.0/8"}}},
	} {
		w := do(t, h, http.MethodPost, "/v2/sandboxes", tc.body, apiKey)
		if w.Code != http.StatusCreated {
			t.Fatalf("%s: %d %s", tc.name, w.Code, w.Body)
		}
		got := f.created[len(f.created)-1].Network
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: policy %+v, want %+v", tc.name, got, tc.want)
		}
	}
	w := do(t, h, http.MethodPost, "/v2/sandboxes", `{"network":{"denyOut":["10.0.0.0/8"],"allowOut":["10.1.1.1"]}}`, apiKey)
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "allowOut") {
		t.Fatalf("an exception bothyd cannot say: %d %s", w.Code, w.Body)
	}
}

// TestCreateMapsAutoResume: autoPause with autoResume {enabled: true} is a sleep policy of the
// timeout that wakes on use and ignores work, with no lifetime; without autoPause, or with
// autoResume off, the lifetime is as before and there is no policy.
func TestCreateMapsAutoResume(t *testing.T) {
	t.Parallel()
	h, f := newTestHandler(t)
	for _, tc := range []struct {
		name, body string
		sleep      *supervisor.SleepPolicy
	}{
		{"autoPause and autoResume", `{"timeout":30,"autoPause":true,"autoResume":{"enabled":true}}`,
			&supervisor.SleepPolicy{IdleTimeoutS: 30, AutoResume: true, IgnoreWork: true}},
		{"autoResume off", `{"timeout":30,"autoPause":true,"autoResume":{"enabled":false}}`, nil},
		{"autoResume without autoPause", `{"timeout":30,"autoResume":{"enabled":true}}`, nil},
	} {
		if w := do(t, h, http.MethodPost, "/v2/sandboxes", tc.body, apiKey); w.Code != http.StatusCreated {
			t.Fatalf("%s: %d %s", tc.name, w.Code, w.Body)
		}
		req := f.created[len(f.created)-1]
		switch {
		case tc.sleep == nil && (req.Sleep != nil || req.Lifetime == nil):
			t.Errorf("%s: sleep %+v lifetime %+v, want a lifetime and no sleep", tc.name, req.Sleep, req.Lifetime)
		case tc.sleep != nil && (req.Sleep == nil || *req.Sleep != *tc.sleep || req.Lifetime != nil):
			t.Errorf("%s: sleep %+v lifetime %+v, want sleep %+v and no lifetime", tc.name, req.Sleep, req.Lifetime, tc.sleep)
		}
	}
}
