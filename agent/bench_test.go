package agent

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
)

// BenchmarkExecTrue measures an exec round trip of `true` over a unix socket: open the stream,
// start the workload, collect its exit. It reports the median besides the mean.
func BenchmarkExecTrue(b *testing.B) {
	ta := startAgent(b)
	c := ta.dial(b)
	ctx := context.Background()
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		p, err := c.Exec(ctx, control.ExecRequest{Argv: []string{"/bin/true"}})
		if err != nil {
			b.Fatal(err)
		}
		go io.Copy(io.Discard, p.Stderr)
		io.Copy(io.Discard, p.Stdout)
		if st, err := p.Wait(); err != nil || st.ExitCode != 0 {
			b.Fatal(st, err)
		}
		durs = append(durs, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds()), "median-µs")
	b.ReportMetric(float64(durs[len(durs)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkStdoutThroughput measures how fast a workload's stdout reaches the client.
func BenchmarkStdoutThroughput(b *testing.B) {
	ta := startAgent(b)
	c := ta.dial(b)
	const size = 256 << 20
	b.SetBytes(size)
	for b.Loop() {
		p, err := c.Exec(context.Background(), control.ExecRequest{Argv: []string{"head", "-c", "256M", "/dev/zero"}})
		if err != nil {
			b.Fatal(err)
		}
		go io.Copy(io.Discard, p.Stderr)
		n, _ := io.Copy(io.Discard, p.Stdout)
		if st, err := p.Wait(); err != nil || st.ExitCode != 0 || n != size {
			b.Fatal(st, err, n)
		}
	}
}
