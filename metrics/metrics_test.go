package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// value finds one sample by name and labels in a gather.
func value(t *testing.T, m *Metrics, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, s := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range s.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return sampleValue(mf.GetType(), s), true
		}
	}
	return 0, false
}

func sampleValue(typ dto.MetricType, s *dto.Metric) float64 {
	switch typ {
	case dto.MetricType_COUNTER:
		return s.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return s.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(s.GetHistogram().GetSampleCount())
	}
	return 0
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	var sandboxes []*supervisor.Status
	m := New(func() ([]*supervisor.Status, error) { return sandboxes, nil }, nil)

	sandboxes = []*supervisor.Status{{State: "running"}, {State: "running"}, {State: "stopped"}}
	for state, want := range map[string]float64{"running": 2, "stopped": 1, "provisioned": 0} {
		if got, ok := value(t, m, "bothy_sandboxes", map[string]string{"state": state}); !ok || got != want {
			t.Errorf("sandboxes{state=%s} = %v (present %v), want %v", state, got, ok, want)
		}
	}

	busy := errcode.New(errcode.SandboxBusy, "busy")
	m.OnTransition("start", 20*time.Millisecond, nil)
	m.OnTransition("exec-admission", time.Millisecond, nil)
	m.OnTransition("exec-admission", time.Second, busy)
	m.OnTransition("stop", time.Second, errors.New("no code"))
	m.OnExec("stream", time.Second, false, nil)
	m.OnExec("buffered", time.Second, true, nil)
	m.OnProblem(errcode.SandboxBusy, 423)
	m.OnEvent("sandbox.created")

	cases := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"bothy_transition_duration_seconds", map[string]string{"op": "start", "result": "ok"}, 1},
		{"bothy_transition_duration_seconds", map[string]string{"op": "stop", "result": "internal"}, 1},
		{"bothy_exec_admission_wait_seconds", map[string]string{"result": "ok"}, 1},
		{"bothy_exec_admission_wait_seconds", map[string]string{"result": "sandbox-busy"}, 1},
		{"bothy_exec_busy_total", nil, 1},
		{"bothy_execs_total", map[string]string{"mode": "stream", "result": "ok"}, 1},
		{"bothy_execs_total", map[string]string{"mode": "buffered", "result": "timed-out"}, 1},
		{"bothy_exec_duration_seconds", map[string]string{"mode": "stream"}, 1},
		{"bothy_http_errors_total", map[string]string{"code": "sandbox-busy", "status": "423"}, 1},
		{"bothy_events_total", map[string]string{"type": "sandbox.created"}, 1},
	}
	for _, tc := range cases {
		if got, ok := value(t, m, tc.name, tc.labels); !ok || got != tc.want {
			t.Errorf("%s%v = %v (present %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{`bothy_sandboxes{state="running"} 2`, "go_goroutines", "process_start_time_seconds"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("the exposition lacks %q", want)
		}
	}
}

// A failing list is reported as a scrape error of that metric, not a crash or a stale value.
func TestSandboxListFailure(t *testing.T) {
	t.Parallel()
	m := New(func() ([]*supervisor.Status, error) { return nil, errors.New("disk gone") }, nil)
	if _, err := m.Registry().Gather(); err == nil {
		t.Fatal("a failing list gathered without an error")
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "GET", "/metrics", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "go_goroutines") {
		t.Fatalf("the other metrics are still served: %d", rec.Code)
	}
}
