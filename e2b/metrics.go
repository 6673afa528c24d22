package e2b

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/usage"
)

// metricBody is E2B's SandboxMetric, one sample of a sandbox's usage.
type metricBody struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// maxMetricIDs bounds the sandboxes one GET /sandboxes/metrics may name.
const maxMetricIDs = 100

// metricOf is a sample in E2B's form: the CPU rate as a percentage of the sandbox's CPUs
// (E2B's cpuUsedPct), the memory limit as its total (the configured size without one).
func (h *Handler) metricOf(sm usage.Sample, memoryMB int) metricBody {
	cpus := sm.VCPUs
	if cpus <= 0 {
		cpus = h.cfg.Resources.VCPUs
	}
	m := metricBody{
		Timestamp: sm.At.UTC(), TimestampUnix: sm.At.Unix(), CPUCount: cpus,
		MemUsed: sm.MemoryBytes, MemTotal: sm.MemoryLimitBytes,
		DiskUsed: sm.DiskUsedBytes, DiskTotal: sm.DiskLimitBytes,
	}
	if cpus > 0 && sm.HasRate {
		m.CPUUsedPct = sm.CPURate / float64(cpus) * 100
	}
	if m.MemTotal == 0 {
		m.MemTotal = int64(memoryMB) << 20
	}
	return m
}

// metrics is E2B's getMetrics: the sandbox's sampled history and a reading now, oldest first,
// within the query's start and end (Unix seconds, both optional).
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	if h.cfg.Usage == nil {
		h.fail(w, r, errcode.New(errcode.NotImplemented, "This server does not sample sandboxes' usage."))
		return
	}
	var start, end int64 = 0, 1<<62 - 1
	for _, q := range []struct {
		name string
		into *int64
	}{{"start", &start}, {"end", &end}} {
		if v := r.URL.Query().Get(q.name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeError(w, http.StatusBadRequest, "%s must be a time in Unix seconds, not %q.", q.name, v)
				return
			}
			*q.into = n
		}
	}
	cur, hist, err := h.cfg.Usage.Read(st.Config.ID)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := []metricBody{}
	for _, sm := range append(hist, cur) {
		if t := sm.At.Unix(); t >= start && t <= end {
			out = append(out, h.metricOf(sm, st.Config.Resources.MemoryMB))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxesMetrics is E2B's GET /sandboxes/metrics: a reading now of each running sandbox that
// sandbox_ids names (comma-separated, and repeated); the others are left out.
func (h *Handler) sandboxesMetrics(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Usage == nil {
		h.fail(w, r, errcode.New(errcode.NotImplemented, "This server does not sample sandboxes' usage."))
		return
	}
	var ids []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 || len(ids) > maxMetricIDs {
		writeError(w, http.StatusBadRequest, "Name 1 to %d sandboxes in sandbox_ids (comma-separated).", maxMetricIDs)
		return
	}
	out := map[string]metricBody{}
	for _, id := range ids {
		if !sandboxID.MatchString(id) {
			continue
		}
		st, err := h.sup.Status(id)
		if err != nil {
			continue
		}
		cur, _, err := h.cfg.Usage.Read(id)
		if err != nil {
			continue // not running: E2B lists running sandboxes alone
		}
		out[id] = h.metricOf(cur, st.Config.Resources.MemoryMB)
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}
