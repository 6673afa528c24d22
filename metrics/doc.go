// Package metrics is bothyd's Prometheus instrumentation, served at /metrics. It owns its
// own registry (with the Go runtime and process collectors), so that nothing registered by a
// library behind bothyd's back is exposed. It observes through hooks only: the supervisor's
// OnTransition and OnEvent ([Metrics.OnTransition], [Metrics.OnEvent]), the handlers' OnExec
// ([Metrics.OnExec]) and the server's OnProblem ([Metrics.OnProblem]) call it, and the
// sandboxes by state are counted at scrape time from the supervisor's List. It never drives
// anything.
//
// # Metrics
//
//   - bothy_sandboxes{state}: sandboxes by state, at scrape time.
//   - bothy_transition_duration_seconds{op,result}: lifecycle transitions (provision,
//     start, stop, deprovision, exec-admission, capture, clone) by result: ok or the error
//     code.
//   - bothy_exec_admission_wait_seconds{result}: how long execs waited for admission.
//   - bothy_exec_busy_total: execs refused with sandbox-busy.
//   - bothy_execs_total{mode,result} and bothy_exec_duration_seconds{mode}: execs run,
//     buffered or stream, by result (ok, timed-out or an error code), and how long they ran.
//   - bothy_http_errors_total{code,status}: problem responses by error code.
//   - bothy_events_total{type}: events published.
package metrics
