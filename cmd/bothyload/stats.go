package main

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// recorder collects, per operation, the latency of every success and the count of every
// failure by its error key ("423 sandbox-busy", "transport", ...). It is shared by all the
// clients of a phase.
type recorder struct {
	mu  sync.Mutex
	ops map[string]*opStats
}

type opStats struct {
	durs   []time.Duration
	errors map[string]int
	bytes  int64
}

func newRecorder() *recorder { return &recorder{ops: map[string]*opStats{}} }

func (r *recorder) get(op string) *opStats {
	s := r.ops[op]
	if s == nil {
		s = &opStats{errors: map[string]int{}}
		r.ops[op] = s
	}
	return s
}

// ok records a success of op that took d and moved n bytes.
func (r *recorder) ok(op string, d time.Duration, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.get(op)
	s.durs = append(s.durs, d)
	s.bytes += n
}

// fail records a failure of op under its error key.
func (r *recorder) fail(op, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.get(op).errors[key]++
}

// OpReport is one operation's figures in a phase.
type OpReport struct {
	Op          string         `json:"op"`
	Count       int            `json:"count"`
	Errors      map[string]int `json:"errors,omitempty"`
	P50MS       float64        `json:"p50_ms"`
	P90MS       float64        `json:"p90_ms"`
	P99MS       float64        `json:"p99_ms"`
	MaxMS       float64        `json:"max_ms"`
	PerSecond   float64        `json:"per_second"`
	MBPerSecond float64        `json:"mb_per_second,omitempty"`
}

// report turns what was recorded over elapsed into sorted per-operation figures.
func (r *recorder) report(elapsed time.Duration) []OpReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]OpReport, 0, len(r.ops))
	for op, s := range r.ops {
		durs := slices.Clone(s.durs)
		slices.Sort(durs)
		rep := OpReport{Op: op, Count: len(durs), Errors: s.errors}
		if len(durs) > 0 {
			rep.P50MS = ms(quantile(durs, 0.50))
			rep.P90MS = ms(quantile(durs, 0.90))
			rep.P99MS = ms(quantile(durs, 0.99))
			rep.MaxMS = ms(durs[len(durs)-1])
		}
		if elapsed > 0 {
			rep.PerSecond = float64(len(durs)) / elapsed.Seconds()
			if s.bytes > 0 {
				// The bytes of a stream are counted when it ends, so the rate is over the
				// time the streams ran, not the phase (which also spends time elsewhere).
				var busy time.Duration
				for _, d := range durs {
					busy += d
				}
				rep.MBPerSecond = float64(s.bytes) / 1e6 / busy.Seconds()
			}
		}
		if len(rep.Errors) == 0 {
			rep.Errors = nil
		}
		out = append(out, rep)
	}
	sort.Slice(out, func(i, j int) bool { return opOrder(out[i].Op) < opOrder(out[j].Op) })
	return out
}

// quantile is the nearest-rank quantile of sorted durations.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// opOrder lists the cycles first, then their steps, in the order they happen.
func opOrder(op string) string {
	order := []string{"lifecycle", "exec", "stream", "clone", "create", "start", "exec-true", "stop", "delete", "clone-create"}
	if i := slices.Index(order, op); i >= 0 {
		return fmt.Sprintf("%02d", i)
	}
	return "99" + op
}

// printTable writes a phase's figures as an aligned table.
func printTable(w io.Writer, ops []OpReport) {
	fmt.Fprintf(w, "  %-13s %7s %9s %9s %9s %9s %10s %9s  %s\n", "op", "count", "p50 ms", "p90 ms", "p99 ms", "max ms", "per s", "MB/s", "errors")
	for _, o := range ops {
		var errs []string
		for k, n := range o.Errors {
			errs = append(errs, fmt.Sprintf("%s×%d", k, n))
		}
		slices.Sort(errs)
		mbs := "-"
		if o.MBPerSecond > 0 {
			mbs = fmt.Sprintf("%.0f", o.MBPerSecond)
		}
		fmt.Fprintf(w, "  %-13s %7d %9.2f %9.2f %9.2f %9.2f %10.1f %9s  %s\n",
			o.Op, o.Count, o.P50MS, o.P90MS, o.P99MS, o.MaxMS, o.PerSecond, mbs, strings.Join(errs, ", "))
	}
}
