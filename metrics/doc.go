// Package metrics is sandboxd's Prometheus instrumentation, served at /metrics. It owns its
// own registry (with the Go runtime and process collectors), so that nothing registered by a
// library behind sandboxd's back is exposed. It observes through hooks only: the supervisor's
// OnTransition and OnEvent ([Metrics.OnTransition], [Metrics.OnEvent]), the handlers' OnExec
// ([Metrics.OnExec]) and the server's OnProblem ([Metrics.OnProblem]) call it, and the
// sandboxes by state are counted at scrape time from the supervisor's List. It never drives
// anything.
//
// # Metrics
//
//   - sandboxd_sandboxes{state}: sandboxes by state, at scrape time.
//   - sandboxd_transition_duration_seconds{op,result}: lifecycle transitions (provision,
//     start, stop, deprovision, exec-admission, capture, clone) by result: ok or the error
//     code.
//   - sandboxd_exec_admission_wait_seconds{result}: how long execs waited for admission.
//   - sandboxd_exec_busy_total: execs refused with sandbox-busy.
//   - sandboxd_execs_total{mode,result} and sandboxd_exec_duration_seconds{mode}: execs run,
//     buffered or stream, by result (ok, timed-out or an error code), and how long they ran.
//   - sandboxd_http_errors_total{code,status}: problem responses by error code.
//   - sandboxd_events_total{type}: events published.
package metrics
