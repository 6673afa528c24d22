package handlers

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// TestCreateRequest: a create request maps onto the supervisor's, with the server's defaults
// for what it leaves out; a clone names its generation and asks for resources only when the
// request did.
func TestCreateRequest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		body  string
		check func(t *testing.T, r supervisor.CreateRequest)
	}{
		{"empty", `{}`, checkCreateDefaults},
		{"partial resources", `{"id":"a1","image":"py","resources":{"memory_mb":1024,"disk_mb":64},"env":["A=1","B=x=y"],"labels":{"team":"ci"}}`, checkCreateOverrides},
		{"clone takes the generation's resources", `{"id":"c1","template":"base","resources":{"disk_mb":32}}`, checkCloneOwnDisk},
		{"clone asks for resources", `{"id":"c2","template":"base","generation":"g000001","image":"py","resources":{"vcpus":2}}`, checkCloneResources},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeSupervisor{}
			h, _ := newTestHandlers(t, f)
			code, body := do(t, newTestServer(t, h), "POST", "/v1/sandboxes", tc.body)
			if code != http.StatusCreated || len(f.created) != 1 {
				t.Fatalf("%d %s, %d creates", code, body, len(f.created))
			}
			tc.check(t, f.created[0])
			if len(f.started) != 0 {
				t.Errorf("started without start=true")
			}
		})
	}
}

func checkCreateDefaults(t *testing.T, r supervisor.CreateRequest) {
	if !strings.HasPrefix(r.ID, "sb-") || len(r.ID) != 15 {
		t.Errorf("generated id %q", r.ID)
	}
	if r.Resources != testDefaults || r.DiskMB != 0 || r.Image != "" || r.Clone != nil || r.Env != nil || r.Labels != nil {
		t.Errorf("defaults: %+v", r)
	}
}

func checkCreateOverrides(t *testing.T, r supervisor.CreateRequest) {
	want := testDefaults
	want.MemoryMB = 1024
	if r.ID != "a1" || r.Image != "py" || r.Resources != want || r.DiskMB != 64 {
		t.Errorf("mapped as %+v", r)
	}
	if r.Env["A"] != "1" || r.Env["B"] != "x=y" || len(r.Env) != 2 || r.Labels["team"] != "ci" {
		t.Errorf("env %v, labels %v", r.Env, r.Labels)
	}
}

func checkCloneOwnDisk(t *testing.T, r supervisor.CreateRequest) {
	if r.Clone == nil || r.Clone.Template != "base" || r.Clone.Generation != "" || r.Clone.Resources != nil || r.Clone.Image != "" {
		t.Errorf("clone %+v", r.Clone)
	}
	if r.DiskMB != 32 {
		t.Errorf("a clone's own disk: %d", r.DiskMB)
	}
}

func checkCloneResources(t *testing.T, r supervisor.CreateRequest) {
	// What the clone names; the others are the generation's (0), not the server's defaults.
	want := supervisor.Resources{VCPUs: 2}
	if c := r.Clone; c == nil || c.Generation != "g000001" || c.Image != "py" || c.Resources == nil || *c.Resources != want {
		t.Errorf("clone %+v", r.Clone)
	}
}

// TestCreateStarts: start=true starts the sandbox it created, and answers its running state.
func TestCreateStarts(t *testing.T) {
	t.Parallel()
	f := &fakeSupervisor{}
	h, _ := newTestHandlers(t, f)
	code, body := do(t, newTestServer(t, h), "POST", "/v1/sandboxes", `{"id":"a1","start":true}`)
	var sb openapi.Sandbox
	if err := json.Unmarshal(body, &sb); err != nil || code != http.StatusCreated {
		t.Fatalf("%d %s", code, body)
	}
	if len(f.started) != 1 || f.started[0] != "a1" || sb.State != openapi.SandboxStateRunning {
		t.Errorf("started %v, state %s", f.started, sb.State)
	}
}

// TestCreateRefusals: what the contract cannot say is checked by the handler, as
// invalid-request with the field at fault, before the supervisor is asked.
func TestCreateRefusals(t *testing.T) {
	t.Parallel()
	for body, field := range map[string]string{
		`{"generation":"g000001"}`:          "generation",
		`{"labels":{"Team":"x"}}`:           "labels",
		`{"labels":{"-team":"x"}}`:          "labels",
		`{"resources":{"vcpus":0}}`:         "resources.vcpus",
		`{"id":"Not_An_Id"}`:                "id",
		`{"resources":{"memory_mb":"big"}}`: "resources.memory_mb",
	} {
		f := &fakeSupervisor{}
		h, _ := newTestHandlers(t, f)
		code, resp := do(t, newTestServer(t, h), "POST", "/v1/sandboxes", body)
		if p := problemOf(t, resp); code != http.StatusBadRequest || p.Code != string(errcode.InvalidRequest) || p.Field != field {
			t.Errorf("%s: %d %+v, want invalid-request on %s", body, code, p, field)
		}
		if len(f.created) != 0 {
			t.Errorf("%s: refused, but created", body)
		}
	}
}

// TestEnvMap: entries without a key are refused (the contract's pattern keeps them out of
// requests; the handler does not rely on it).
func TestEnvMap(t *testing.T) {
	t.Parallel()
	if m, err := envMap("env", &[]string{"A=1", "A=2", "E="}); err != nil || m["A"] != "2" || m["E"] != "" || len(m) != 2 {
		t.Errorf("envMap: %v, %v", m, err)
	}
	for _, bad := range []string{"=1", "A"} {
		if _, err := envMap("env", &[]string{bad}); errcode.Of(err) != errcode.InvalidRequest {
			t.Errorf("envMap(%q): %v, want invalid-request", bad, err)
		}
	}
	if m, err := envMap("env", nil); m != nil || err != nil {
		t.Errorf("envMap(nil): %v, %v", m, err)
	}
}

// TestSandboxView: a status reads as the contract's sandbox; a runtime mismatch does not
// change the state the API shows.
func TestSandboxView(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	st := &supervisor.Status{
		Config: supervisor.Config{
			ID: "a1", Image: "host", Resources: supervisor.Resources{VCPUs: 2, MemoryMB: 256, Pids: 64}, DiskMB: 16,
			Env: map[string]string{"B": "secret", "A": "secret"}, CreatedAt: at,
		},
		State:           supervisor.StateRunning,
		StartedAt:       &at,
		RuntimeMismatch: true,
		Binding:         &supervisor.Binding{Template: "base", Generation: "g000002", Lease: "l1"},
		LastExit:        &supervisor.Exit{ExitCode: 3, Reason: supervisor.ReasonExited, At: at},
	}
	sb := apiSandbox(st)
	if sb.State != openapi.SandboxStateRunning {
		t.Errorf("state %q, want running: a mismatch is no state", sb.State)
	}
	if sb.Labels == nil || len(sb.Labels) != 0 {
		t.Errorf("labels %v, want an empty map", sb.Labels)
	}
	if sb.EnvKeys == nil || strings.Join(*sb.EnvKeys, ",") != "A,B" {
		t.Errorf("env keys %v, want A,B sorted and no values", sb.EnvKeys)
	}
	if sb.Resources != (openapi.Resources{Vcpus: 2, MemoryMb: 256, Pids: 64, DiskMb: 16}) {
		t.Errorf("resources %+v", sb.Resources)
	}
	if sb.Template == nil || *sb.Template != (openapi.TemplateBinding{Template: "base", Generation: "g000002", Lease: "l1"}) {
		t.Errorf("template %+v", sb.Template)
	}
	if le := sb.LastExit; le == nil || le.Code == nil || *le.Code != 3 || le.Signal != nil || le.Reason != openapi.LastExitReasonExited {
		t.Errorf("last exit %+v", sb.LastExit)
	}
}

// TestExitReasons: every reason the runtime reports has its name in the contract; one it
// does not know reads as lost.
func TestExitReasons(t *testing.T) {
	t.Parallel()
	for reason, want := range map[supervisor.ExitReason]openapi.LastExitReason{
		supervisor.ReasonExited:      openapi.LastExitReasonExited,
		supervisor.ReasonSignaled:    openapi.LastExitReasonKilled,
		supervisor.ReasonOOM:         openapi.LastExitReasonOom,
		supervisor.ReasonStopped:     openapi.LastExitReasonStopped,
		supervisor.ReasonStartFailed: openapi.LastExitReasonStartFailed,
		supervisor.ReasonKilled:      openapi.LastExitReasonKilled,
		supervisor.ReasonExpired:     openapi.LastExitReasonExpired,
		"something-new":              openapi.LastExitReasonLost,
	} {
		if got := exitReason(&supervisor.Exit{Reason: reason}); got != want {
			t.Errorf("%s: %s, want %s", reason, got, want)
		}
	}
	// A signal replaces the exit code.
	le := apiSandbox(&supervisor.Status{LastExit: &supervisor.Exit{ExitCode: -1, Signal: "SIGKILL", Reason: supervisor.ReasonSignaled}}).LastExit
	if le == nil || le.Code != nil || le.Signal == nil || *le.Signal != "SIGKILL" {
		t.Errorf("a signalled exit: %+v", le)
	}
}

// TestListSandboxes: filters by state and labels, pages with cursors, and refuses a cursor it
// did not issue.
func TestListSandboxes(t *testing.T) {
	t.Parallel()
	sandbox := func(id string, state supervisor.State, labels map[string]string) *supervisor.Status {
		return &supervisor.Status{Config: supervisor.Config{ID: id, Labels: labels}, State: state}
	}
	f := &fakeSupervisor{list: []*supervisor.Status{
		sandbox("d", supervisor.StateRunning, map[string]string{"team": "ci"}),
		sandbox("a", supervisor.StateRunning, map[string]string{"team": "ci"}),
		sandbox("c", supervisor.StateStopped, map[string]string{"team": "ci"}),
		sandbox("b", supervisor.StateRunning, map[string]string{"team": "web"}),
		sandbox("e", supervisor.StateRunning, nil),
	}}
	h, _ := newTestHandlers(t, f)
	s := newTestServer(t, h)
	list := func(query string) (ids []string, next string) {
		t.Helper()
		code, body := do(t, s, "GET", "/v1/sandboxes?"+query, "")
		var l openapi.SandboxList
		if err := json.Unmarshal(body, &l); err != nil || code != http.StatusOK {
			t.Fatalf("%q: %d %s", query, code, body)
		}
		for _, sb := range l.Items {
			ids = append(ids, sb.ID)
		}
		if l.NextCursor != nil {
			next = *l.NextCursor
		}
		return ids, next
	}
	ids, next := list("state=running&label=team=ci&limit=1")
	if strings.Join(ids, ",") != "a" || next == "" {
		t.Fatalf("first page %v, next %q", ids, next)
	}
	ids, next = list("state=running&label=team=ci&limit=1&cursor=" + next)
	if strings.Join(ids, ",") != "d" || next != "" {
		t.Errorf("second page %v, next %q", ids, next)
	}
	if ids, _ := list(""); strings.Join(ids, ",") != "a,b,c,d,e" {
		t.Errorf("unfiltered %v, want all in id order", ids)
	}
	for query, field := range map[string]string{"cursor=AAAA-": "cursor", "cursor=-a": "cursor", "cursor=LQ": "cursor", "label=team": "label", "label=Team=x": "label"} {
		code, body := do(t, s, "GET", "/v1/sandboxes?"+query, "")
		if p := problemOf(t, body); code != http.StatusBadRequest || p.Field != field {
			t.Errorf("%q: %d %+v, want invalid-request on %s", query, code, p, field)
		}
	}
}

// TestGetSandboxNotFound: the supervisor's sandbox-not-found is the API's 404.
func TestGetSandboxNotFound(t *testing.T) {
	t.Parallel()
	h, _ := newTestHandlers(t, &fakeSupervisor{})
	code, body := do(t, newTestServer(t, h), "GET", "/v1/sandboxes/nope", "")
	if p := problemOf(t, body); code != http.StatusNotFound || p.Code != string(errcode.SandboxNotFound) {
		t.Errorf("%d %+v, want 404 sandbox-not-found", code, p)
	}
}

// TestCreateRuntime: a create's runtime reaches the supervisor and comes back on the
// sandbox; the server's default disk applies to namespace sandboxes only, a microVM having
// no disk of that kind, while a disk the request names is passed on for the supervisor to
// judge.
func TestCreateRuntime(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, body string
		runtime    string
		disk       int
		answered   openapi.RuntimeKind
	}{
		{"none", `{"id":"a1"}`, "", 1024, openapi.RuntimeKindNamespace},
		{"namespace", `{"id":"a1","runtime":"namespace"}`, "namespace", 1024, openapi.RuntimeKindNamespace},
		{"microvm", `{"id":"a1","runtime":"microvm"}`, "microvm", 0, openapi.RuntimeKindMicrovm},
		{"microvm with a disk", `{"id":"a1","runtime":"microvm","resources":{"disk_mb":64}}`, "microvm", 64, openapi.RuntimeKindMicrovm},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeSupervisor{}
			h, _ := newTestHandlers(t, f)
			h.cfg.DefaultDiskMB = 1024
			code, body := do(t, newTestServer(t, h), "POST", "/v1/sandboxes", tc.body)
			var sb openapi.Sandbox
			if err := json.Unmarshal(body, &sb); err != nil || code != http.StatusCreated || len(f.created) != 1 {
				t.Fatalf("%d %s", code, body)
			}
			if r := f.created[0]; r.Runtime != tc.runtime || r.DiskMB != tc.disk {
				t.Errorf("asked the supervisor for runtime %q disk %d, want %q %d", r.Runtime, r.DiskMB, tc.runtime, tc.disk)
			}
			if sb.Runtime != tc.answered {
				t.Errorf("the sandbox's runtime reads %q", sb.Runtime)
			}
		})
	}
	f := &fakeSupervisor{}
	h, _ := newTestHandlers(t, f)
	if code, body := do(t, newTestServer(t, h), "POST", "/v1/sandboxes", `{"runtime":"qemu"}`); code != http.StatusBadRequest || len(f.created) != 0 {
		t.Errorf("an unknown runtime: %d %s", code, body)
	}
}
