package handlers

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/bothy/bothy/openapi"
	"github.com/bothy/bothy/supervisor"
)

// TestInfo: /v1/info names the supervisor's runtime and images and the handlers' limits.
func TestInfo(t *testing.T) {
	t.Parallel()
	h, _ := newTestHandlers(t, &fakeSupervisor{images: []string{supervisor.HostImage, "py"}})
	code, body := do(t, newTestServer(t, h), "GET", "/v1/info", "")
	var info openapi.Info
	if err := json.Unmarshal(body, &info); err != nil || code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	if info.Version != "test" || info.Runtime.Kind != "namespace" || info.Runtime.Identity != "namespace/test" {
		t.Errorf("version and runtime %+v %+v", info.Version, info.Runtime)
	}
	if rs := info.Runtimes; len(rs) != 2 ||
		rs[0].Kind != openapi.RuntimeKindNamespace || !rs[0].Default || rs[0].State != openapi.RuntimeStatusStateReady || rs[0].Identity == nil || *rs[0].Identity != "namespace/test" ||
		rs[1].Kind != openapi.RuntimeKindMicrovm || rs[1].Default || rs[1].State != openapi.RuntimeStatusStateUnavailable || rs[1].Reason == nil || *rs[1].Reason != "missing qemu-system-x86_64" ||
		rs[1].Accelerator != nil {
		t.Errorf("runtimes %+v", rs)
	}
	if len(info.Images) != 2 || info.Images[0].Name != "host" || info.Images[1].Name != "py" ||
		*info.Images[0].Description == *info.Images[1].Description {
		t.Errorf("images %+v", info.Images)
	}
	l := info.Limits
	if l.DefaultResources != (openapi.Resources{Vcpus: 1, MemoryMb: 512, Pids: 256}) ||
		l.MaxExecOutputBytes != supervisor.MaxExecOutput || l.MaxGenerationAgeSeconds != 3600 {
		t.Errorf("limits %+v", l)
	}
}

// TestEventOf: a supervisor event reads as the contract's, its exit as a sandbox's last exit.
func TestEventOf(t *testing.T) {
	t.Parallel()
	e := EventOf(supervisor.Event{
		Type: supervisor.EventExited, Sandbox: "a1", State: supervisor.StateStopped,
		Exit: &supervisor.Exit{ExitCode: 1, Reason: supervisor.ReasonExited},
	})
	if e.Type != openapi.EventType(supervisor.EventExited) || *e.Sandbox != "a1" || *e.State != openapi.SandboxStateStopped ||
		e.Exit == nil || *e.Exit.Code != 1 || e.Template != nil || e.Progress != nil {
		t.Errorf("exit event %+v", e)
	}
	p := EventOf(supervisor.Event{
		Type: supervisor.EventProgress, Template: "base", Generation: "g1", Lease: "l1",
		Progress: &supervisor.Progress{Phase: "copying", Done: 5, Total: 10},
	})
	if p.Sandbox != nil || p.State != nil || *p.Template != "base" || *p.Generation != "g1" || *p.Lease != "l1" ||
		p.Progress == nil || p.Progress.BytesDone != 5 || *p.Progress.BytesTotal != 10 {
		t.Errorf("progress event %+v", p)
	}
}
