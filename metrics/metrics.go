package metrics

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/supervisor"
)

// The states reported by bothy_sandboxes, all of them on every scrape (zeros included), so
// that a query sees a state go to zero rather than vanish.
var states = []supervisor.State{
	supervisor.StateProvisioned,
	supervisor.StateStarting,
	supervisor.StateRunning,
	supervisor.StateStopping,
	supervisor.StateStopped,
}

// latencyBuckets span a fast exec admission (sub-millisecond) to a slow stop (a minute).
var latencyBuckets = prometheus.ExponentialBucketsRange(0.0005, 60, 16)

// Metrics holds bothyd's collectors. Its methods are safe for concurrent use and never
// block on anything but the collectors' own locks.
type Metrics struct {
	reg *prometheus.Registry
	log *slog.Logger

	transitions *prometheus.HistogramVec
	admission   *prometheus.HistogramVec
	busy        prometheus.Counter
	execs       *prometheus.CounterVec
	execTime    *prometheus.HistogramVec
	problems    *prometheus.CounterVec
	events      *prometheus.CounterVec
	// storageFaults counts the state root's storage faults (storage.go).
	storageFaults *prometheus.CounterVec
}

// Lister lists the sandboxes, as supervisor.(*Supervisor).List does.
type Lister func() ([]*supervisor.Status, error)

// New registers the collectors. list is called at every scrape to count sandboxes by state.
func New(list Lister, log *slog.Logger) *Metrics {
	if log == nil {
		log = slog.Default()
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		log: log,
		transitions: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bothy_transition_duration_seconds",
			Help:    "Lifecycle transitions by operation and result (ok or the error code).",
			Buckets: latencyBuckets,
		}, []string{"op", "result"}),
		admission: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bothy_exec_admission_wait_seconds",
			Help:    "How long execs waited for admission (the sandbox's exec lock), by result.",
			Buckets: latencyBuckets,
		}, []string{"result"}),
		busy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bothy_exec_busy_total",
			Help: "Execs refused with sandbox-busy: another exec held the sandbox for all of wait_ms.",
		}),
		execs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bothy_execs_total",
			Help: "Execs run, by mode (buffered or stream) and result (ok, timed-out or an error code).",
		}, []string{"mode", "result"}),
		execTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bothy_exec_duration_seconds",
			Help:    "How long admitted execs ran, by mode (buffered or stream).",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 3600, 20),
		}, []string{"mode"}),
		problems: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bothy_http_errors_total",
			Help: "Problem responses by error code and HTTP status.",
		}, []string{"code", "status"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bothy_events_total",
			Help: "Events published on /v1/events, by type.",
		}, []string{"type"}),
		storageFaults: newStorageFaults(),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.transitions, m.admission, m.busy, m.execs, m.execTime, m.problems, m.events, m.storageFaults,
		&sandboxCollector{list: list, log: log},
	)
	return m
}

// Registry is the registry the metrics are in, for tests and for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// result is the label of an outcome: ok, or the error's code (internal when it has none).
func result(err error) string {
	if err == nil {
		return "ok"
	}
	if c := errcode.Of(err); c != "" {
		return string(c)
	}
	return string(errcode.Internal)
}

// OnTransition is the supervisor's hook (supervisor.Options.OnTransition).
func (m *Metrics) OnTransition(op string, d time.Duration, err error) {
	res := result(err)
	m.transitions.WithLabelValues(op, res).Observe(d.Seconds())
	if op == "exec-admission" {
		m.admission.WithLabelValues(res).Observe(d.Seconds())
		if errcode.Of(err) == errcode.SandboxBusy {
			m.busy.Inc()
		}
	}
}

// OnExec records an admitted exec that ended (the handlers' hook): mode is buffered or
// stream; timedOut says its timeout killed it; err is why it failed, if it did.
func (m *Metrics) OnExec(mode string, d time.Duration, timedOut bool, err error) {
	res := result(err)
	if err == nil && timedOut {
		res = "timed-out"
	}
	m.execs.WithLabelValues(mode, res).Inc()
	m.execTime.WithLabelValues(mode).Observe(d.Seconds())
}

// OnProblem counts a problem response (the server's hook).
func (m *Metrics) OnProblem(code errcode.Code, status int) {
	m.problems.WithLabelValues(string(code), strconv.Itoa(status)).Inc()
}

// OnEvent counts a published event by type.
func (m *Metrics) OnEvent(typ string) {
	m.events.WithLabelValues(typ).Inc()
}

// sandboxCollector counts sandboxes by state at scrape time, so that the gauge is never stale
// and needs no bookkeeping on every transition.
type sandboxCollector struct {
	list Lister
	log  *slog.Logger
}

var sandboxesDesc = prometheus.NewDesc("bothy_sandboxes", "Sandboxes by state, at scrape time.", []string{"state"}, nil)

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	if c.list == nil {
		return
	}
	all, err := c.list()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
		return
	}
	counts := make(map[supervisor.State]int, len(states))
	for _, st := range all {
		counts[st.State]++
	}
	for _, s := range states {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(counts[s]), string(s))
		delete(counts, s)
	}
	// A state this list does not know yet is still reported.
	for s, n := range counts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), string(s))
	}
}
