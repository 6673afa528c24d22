package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// bwrapArgs is the bare bubblewrap sandbox that a start is compared with (issue 17): new
// namespaces of every kind, /usr read-only, /proc and /dev, then `true`. tests/bench_test.go
// spawns the same.
var bwrapArgs = []string{"--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
	"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "true"}

// benchOptions are the command line of `bothyload bench`.
type benchOptions struct {
	target
	bwrap, prefix              string
	cycles, streams, idle, pid int
	streamBytes                int64
	streamVCPUs                []int
	timeout                    time.Duration
	jsonOut                    bool
}

// BenchReport is what `bothyload bench` measured: each operation's latencies, the bwrap
// spawns interleaved with them, and the stream rates.
type BenchReport struct {
	URL     string        `json:"url"`
	Cycles  int           `json:"cycles"`
	Bwrap   *BenchOp      `json:"bwrap,omitempty"`
	Ops     []BenchOp     `json:"ops"`
	Streams []BenchStream `json:"streams"`
	Idle    *BenchIdle    `json:"idle,omitempty"`
	// CPU is the CPU time of a cycle in each series against a bwrap spawn's (with --pid).
	CPU []BenchCPU `json:"cpu,omitempty"`
}

// BenchCPU is the CPU time per cycle of one series: bothyd's and everything it reaped (the
// sandboxes' shims, and through them their inits, agents and workloads), over the series
// divided by its cycles, against the mean CPU time of the series' bwrap spawns (bwrap's and
// what it reaped, from wait4). Both count user and system time of the processes; neither
// counts the kernel's deferred work in its threads (a network namespace's teardown).
type BenchCPU struct {
	Op         string  `json:"op"`
	Cycles     int     `json:"cycles"`
	MSPerCycle float64 `json:"ms_per_cycle"`
	// ServerMS and ReapedMS split MSPerCycle: bothyd's own, and that of the processes it
	// reaped (the sandboxes' shims, inits, agents and workloads, and its helpers).
	ServerMS float64 `json:"server_ms"`
	ReapedMS float64 `json:"reaped_ms"`
	BwrapMS  float64 `json:"bwrap_ms,omitempty"`
	XBwrap   float64 `json:"x_bwrap,omitempty"`
	Goal     float64 `json:"goal_x_bwrap,omitempty"`
	Met      *bool   `json:"met,omitempty"`
}

// cpuGoalXBwrap is issue 42's bound on a cycle's CPU time, as a multiple of a bwrap spawn's.
const cpuGoalXBwrap = 2.5

// BenchIdle is what --idle measured: N idle running sandboxes, the host memory they took
// (MemTotal - MemAvailable of /proc/meminfo, so everything on the host counts: read it on a
// quiet host) once they settled (idleSettle after the last start) and right after the last
// start, and how long a listing, an exec and a page took with them all present.
type BenchIdle struct {
	N       int     `json:"n"`
	CreateS float64 `json:"create_s"`
	HostMiB float64 `json:"host_mib"`
	MiBEach float64 `json:"mib_each"`
	// MiBEachAtStart is MiBEach read right after the last start, before the last shims shed
	// their set-up.
	MiBEachAtStart float64 `json:"mib_each_at_start"`
	// PSSMiBEach is the growth of the proportional set size of every process below bothyd
	// (with --pid), per idle sandbox, once they settled: the part of MiBEach that the
	// sandboxes' own processes take, the rest being the kernel's (page tables, namespaces,
	// cgroups, the shim's tmpfs).
	PSSMiBEach    float64 `json:"pss_mib_each,omitempty"`
	GoalMiBEach   float64 `json:"goal_mib_each"`
	ListAllMS     float64 `json:"list_all_ms"`
	ListPageMS    float64 `json:"list_page_ms"`
	ExecMedianMS  float64 `json:"exec_median_ms"`
	DeleteS       float64 `json:"delete_s"`
	CreateClients int     `json:"create_clients"`
}

// idleGoalMiB is issue 42's bound on the host memory of one idle sandbox (issue 17's was 4).
const idleGoalMiB = 1

// BenchOp is one operation's latencies over the run, and its median as a multiple of the
// median bwrap spawn of the same run.
type BenchOp struct {
	Op       string  `json:"op"`
	N        int     `json:"n"`
	MedianMS float64 `json:"median_ms"`
	P90MS    float64 `json:"p90_ms"`
	XBwrap   float64 `json:"x_bwrap,omitempty"`
	// Goal is the bound on XBwrap (0: none), Met whether the run meets it.
	Goal float64 `json:"goal_x_bwrap,omitempty"`
	Met  *bool   `json:"met,omitempty"`
}

// BenchStream is the websocket stdout rate of `head -c N /dev/zero` in a sandbox of VCPUs.
type BenchStream struct {
	VCPUs     int     `json:"vcpus"`
	Bytes     int64   `json:"bytes"`
	N         int     `json:"n"`
	MedianMBs float64 `json:"median_mb_per_s"`
	GoalMBs   float64 `json:"goal_mb_per_s"`
	Met       bool    `json:"met"`
}

// The rows of the series whose creates name an id of their own.
const (
	ownCreateStart = "create+start, own id"
	ownStop        = "stop, own id"
	ownCycle       = "cycle, own id"
)

// benchGoals are issue 17's bounds, as multiples of a bwrap spawn; issue 42 holds a create
// that names its own id to the same.
var benchGoals = map[string]float64{"create+start": 1.5, "stop": 2, "cycle": 3, ownCreateStart: 1.5, ownStop: 2, ownCycle: 3}

// streamGoalMBs is the websocket stdout goal of issues 17 and 42.
const streamGoalMBs = 1000

// runBench is `bothyload bench`: a sequential full cycle (create with start, exec `true`,
// forced stop, delete) --cycles times, each followed by a bwrap spawn so that both see the same
// load of the machine, then --streams websocket streams per --stream-vcpus entry.
func runBench(args []string, stdout, stderr io.Writer) (int, error) {
	o, err := parseBenchFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, nil
		}
		return 2, err
	}
	token, code, err := o.token()
	if err != nil {
		return code, err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	b := &bench{o: o, api: newAPI(o.url, token, 1)}
	defer b.cleanup()
	if err := b.api.waitForProbes(ctx, stderr); err != nil {
		return 1, err
	}
	rep, err := b.run(ctx)
	if err != nil {
		return 1, err
	}
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return 0, enc.Encode(rep)
	}
	rep.print(stdout)
	return 0, nil
}

func parseBenchFlags(args []string, stderr io.Writer) (benchOptions, error) {
	var o benchOptions
	var vcpus string
	fs := flag.NewFlagSet("bothyload bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(fs, "allow a URL that is not a loopback address (the bwrap baseline then runs on another host than the server)")
	fs.IntVar(&o.cycles, "cycles", 50, "full cycles to time, each with a bwrap spawn")
	fs.IntVar(&o.streams, "streams", 3, "streams per --stream-vcpus entry (0: none)")
	fs.IntVar(&o.pid, "pid", 0, "bothyd's pid, on this host: report the CPU time of a cycle (bothyd's and its reaped sandboxes') against a bwrap spawn's, and the idle sandboxes' PSS")
	fs.IntVar(&o.idle, "idle", 0, "then start this many idle sandboxes (no disk, 128 MiB limit) and report the host memory each takes, a listing and an exec among them (0: none; they are deleted afterwards)")
	fs.Int64Var(&o.streamBytes, "stream-bytes", 256<<20, "bytes a stream reads (head -c N /dev/zero)")
	fs.StringVar(&vcpus, "stream-vcpus", "1,2", "the vcpus of the sandboxes streamed from, one sandbox each")
	fs.StringVar(&o.bwrap, "bwrap", "", "the bubblewrap binary of the baseline (default: bwrap on $PATH; none: figures without ratios)")
	fs.StringVar(&o.prefix, "prefix", "", "prefix of the sandbox ids (default: bench-<random>)")
	fs.DurationVar(&o.timeout, "request-timeout", 60*time.Second, "deadline of one request")
	fs.BoolVar(&o.jsonOut, "json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.cycles < 1 || o.cycles > 100000 || o.streams < 0 || o.idle < 0 || o.idle > 100000 || o.streamBytes < 1 || o.timeout <= 0 || o.pid < 0 {
		return o, errors.New("--cycles must be 1 to 100000, --streams not negative, --idle 0 to 100000, --stream-bytes and --request-timeout positive, --pid not negative")
	}
	if o.pid > 0 {
		if _, err := cpuTime(o.pid); err != nil {
			return o, fmt.Errorf("--pid %d: %w", o.pid, err)
		}
	}
	for f := range strings.SplitSeq(vcpus, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1024 {
			return o, fmt.Errorf("--stream-vcpus: %q is not a number from 1 to 1024", f)
		}
		o.streamVCPUs = append(o.streamVCPUs, n)
	}
	if o.prefix == "" {
		o.prefix = fmt.Sprintf("bench-%06x", rand.Uint32()&0xffffff)
	}
	return o, nil
}

// bench is one run of `bothyload bench`.
type bench struct {
	o   benchOptions
	api *api
	// live are the sandboxes made and not yet deleted, for the clean-up after a failure.
	live []string
}

func (b *bench) run(ctx context.Context) (*BenchReport, error) {
	bwrap := b.o.bwrap
	if bwrap == "" {
		bwrap, _ = exec.LookPath("bwrap")
	}
	if bwrap != "" {
		// The first spawn pages bwrap and its libraries in; it is not timed.
		if _, err := spawn(ctx, bwrap); err != nil {
			return nil, err
		}
	}
	rep := &BenchReport{URL: b.o.url, Cycles: b.o.cycles}
	// Two series of cycles, each cycle followed by a bwrap spawn: first with ids of their own
	// (every create starts a sandbox of its own), then with the server's (a create that names
	// nothing, as an SDK's does: the server gives it a spare sandbox where it keeps them).
	names := []string{"create+start", "exec", "stop", "delete", "cycle"}
	var own, anon [][]time.Duration
	var base []time.Duration
	for _, series := range []struct {
		lat   *[][]time.Duration
		named bool
		op    string
	}{{&own, true, ownCycle}, {&anon, false, "cycle"}} {
		*series.lat = make([][]time.Duration, len(names))
		cpu := b.startCPU()
		for i := range b.o.cycles {
			id := ""
			if series.named {
				id = fmt.Sprintf("%s-%d", b.o.prefix, i)
			}
			steps, err := b.cycle(ctx, id)
			if err != nil {
				return nil, err
			}
			for j, d := range steps {
				(*series.lat)[j] = append((*series.lat)[j], d)
			}
			if bwrap != "" {
				t0 := time.Now()
				used, err := spawn(ctx, bwrap)
				if err != nil {
					return nil, err
				}
				base = append(base, time.Since(t0))
				cpu.bwrap += used
			}
		}
		if c, err := cpu.end(series.op, b.o.cycles, bwrap != ""); err != nil {
			return nil, err
		} else if c != nil {
			rep.CPU = append(rep.CPU, *c)
		}
	}
	var baseMedian time.Duration
	if len(base) > 0 {
		op := benchOp("bwrap", base, 0)
		rep.Bwrap, baseMedian = &op, median(base)
	}
	for j, name := range names {
		rep.Ops = append(rep.Ops, benchOp(name, anon[j], baseMedian))
	}
	rep.Ops = append(rep.Ops, benchOp(ownCreateStart, own[0], baseMedian), benchOp(ownStop, own[2], baseMedian),
		benchOp(ownCycle, own[len(names)-1], baseMedian))
	for _, v := range b.o.streamVCPUs {
		if b.o.streams == 0 {
			break
		}
		s, err := b.stream(ctx, v)
		if err != nil {
			return nil, err
		}
		rep.Streams = append(rep.Streams, s)
	}
	if b.o.idle > 0 {
		idle, err := b.idleRun(ctx)
		if err != nil {
			return nil, err
		}
		rep.Idle = idle
	}
	return rep, nil
}

// idleSettle is how long the idle phase waits after its last start before it reads the host's
// memory: longer than a shim takes to shed its set-up (runtime/namespace/shim, 10 s).
const idleSettle = 12 * time.Second

// idleClients is how many requests the idle phase has in flight at once.
const idleClients = 4

// idleRun starts --idle idle sandboxes, measures, and deletes them.
func (b *bench) idleRun(ctx context.Context) (*BenchIdle, error) {
	ids := make([]string, b.o.idle)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-idle%d", b.o.prefix, i)
	}
	r := &BenchIdle{N: len(ids), GoalMiBEach: idleGoalMiB, CreateClients: idleClients}
	before, err := hostUsedKiB()
	if err != nil {
		return nil, err
	}
	var pssBefore int64
	if b.o.pid > 0 {
		if pssBefore, err = treePSSKiB(b.o.pid); err != nil {
			return nil, err
		}
	}
	b.live = append(b.live, ids...)
	t0 := time.Now()
	err = parallel(ctx, ids, func(ctx context.Context, id string) error {
		rctx, cancel := context.WithTimeout(ctx, b.o.timeout)
		defer cancel()
		return b.api.create(rctx, map[string]any{"id": id, "start": true,
			"resources": map[string]any{"disk_mb": 0, "memory_mb": 128}})
	})
	if err != nil {
		return nil, err
	}
	r.CreateS = time.Since(t0).Seconds()
	atStart, err := hostUsedKiB()
	if err != nil {
		return nil, err
	}
	r.MiBEachAtStart = float64(atStart-before) / 1024 / float64(len(ids))
	// What an idle sandbox costs for as long as it stays idle, not in its first seconds.
	time.Sleep(idleSettle)
	after, err := hostUsedKiB()
	if err != nil {
		return nil, err
	}
	r.HostMiB = float64(after-before) / 1024
	r.MiBEach = r.HostMiB / float64(len(ids))
	if b.o.pid > 0 {
		pss, err := treePSSKiB(b.o.pid)
		if err != nil {
			return nil, err
		}
		r.PSSMiBEach = float64(pss-pssBefore) / 1024 / float64(len(ids))
	}
	timed := func(f func(context.Context) error) (float64, error) {
		rctx, cancel := context.WithTimeout(ctx, b.o.timeout)
		defer cancel()
		t := time.Now()
		err := f(rctx)
		return ms(time.Since(t)), err
	}
	if r.ListAllMS, err = timed(func(ctx context.Context) error { return b.api.listAll(ctx, 1000) }); err != nil {
		return nil, err
	}
	if r.ListPageMS, err = timed(func(ctx context.Context) error { return b.api.listPage(ctx, 100) }); err != nil {
		return nil, err
	}
	var execs []time.Duration
	for i := range 9 {
		d, err := timed(func(ctx context.Context) error {
			_, err := b.api.exec(ctx, ids[i*len(ids)/9], []string{"true"}, "", 0)
			return err
		})
		if err != nil {
			return nil, err
		}
		execs = append(execs, time.Duration(d*float64(time.Millisecond)))
	}
	r.ExecMedianMS = ms(median(execs))
	t0 = time.Now()
	err = parallel(ctx, ids, func(ctx context.Context, id string) error {
		rctx, cancel := context.WithTimeout(ctx, b.o.timeout)
		defer cancel()
		return b.api.forceRemove(rctx, id)
	})
	if err != nil {
		return nil, err
	}
	r.DeleteS = time.Since(t0).Seconds()
	b.live = slices.DeleteFunc(b.live, func(s string) bool { return strings.Contains(s, "-idle") })
	return r, nil
}

// parallel runs f for every id, idleClients at a time, and returns the first error.
func parallel(ctx context.Context, ids []string, f func(context.Context, string) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan string)
	errs := make(chan error, idleClients)
	for range idleClients {
		go func() {
			var first error
			for id := range work {
				if first == nil {
					if err := f(ctx, id); err != nil {
						first = fmt.Errorf("sandbox %s: %w", id, err)
						cancel()
					}
				}
			}
			errs <- first
		}()
	}
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		work <- id
	}
	close(work)
	var err error
	for range idleClients {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	return err
}

// hostUsedKiB is MemTotal - MemAvailable of /proc/meminfo.
func hostUsedKiB() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	var total, avail int64
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			avail = v
		}
	}
	if total == 0 || avail == 0 {
		return 0, errors.New("/proc/meminfo has no MemTotal or MemAvailable")
	}
	return total - avail, nil
}

// cycle is one full cycle of sandbox id ("": an id the server chooses), timed step by step;
// its last duration is the whole.
func (b *bench) cycle(ctx context.Context, id string) ([]time.Duration, error) {
	steps := []func(context.Context) error{
		func(ctx context.Context) error {
			if id != "" {
				b.live = append(b.live, id)
				return b.api.create(ctx, map[string]any{"id": id, "start": true})
			}
			var err error
			if id, err = b.api.createServerID(ctx, map[string]any{"start": true}); err == nil {
				b.live = append(b.live, id)
			}
			return err
		},
		func(ctx context.Context) error {
			_, err := b.api.exec(ctx, id, []string{"true"}, "", 0)
			return err
		},
		func(ctx context.Context) error { return b.api.stop(ctx, id, true) },
		func(ctx context.Context) error {
			if err := b.api.remove(ctx, id); err != nil {
				return err
			}
			b.live = slices.DeleteFunc(b.live, func(s string) bool { return s == id })
			return nil
		},
	}
	var out []time.Duration
	t0 := time.Now()
	for _, step := range steps {
		rctx, cancel := context.WithTimeout(ctx, b.o.timeout)
		t := time.Now()
		err := step(rctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		out = append(out, time.Since(t))
	}
	return append(out, time.Since(t0)), nil
}

// stream times --streams websocket reads of --stream-bytes from a sandbox with vcpus.
func (b *bench) stream(ctx context.Context, vcpus int) (BenchStream, error) {
	id := fmt.Sprintf("%s-stream%d", b.o.prefix, vcpus)
	rctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	b.live = append(b.live, id)
	err := b.api.create(rctx, map[string]any{"id": id, "start": true, "resources": map[string]any{"vcpus": vcpus}})
	cancel()
	if err != nil {
		return BenchStream{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	argv := []string{"head", "-c", strconv.FormatInt(b.o.streamBytes, 10), "/dev/zero"}
	var rates []time.Duration // the time per stream; the rate's median is the time's
	for range b.o.streams {
		rctx, cancel := context.WithTimeout(ctx, b.o.timeout)
		t0 := time.Now()
		n, err := b.api.stream(rctx, id, argv, 0)
		cancel()
		if err != nil {
			return BenchStream{}, fmt.Errorf("stream in %s: %w", id, err)
		}
		if n != b.o.streamBytes {
			return BenchStream{}, fmt.Errorf("stream in %s: %d bytes, want %d", id, n, b.o.streamBytes)
		}
		rates = append(rates, time.Since(t0))
	}
	b.dispose(id)
	mbs := float64(b.o.streamBytes) / 1e6 / median(rates).Seconds()
	return BenchStream{VCPUs: vcpus, Bytes: b.o.streamBytes, N: len(rates), MedianMBs: mbs,
		GoalMBs: streamGoalMBs, Met: mbs >= streamGoalMBs}, nil
}

func (b *bench) dispose(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), b.o.timeout)
	defer cancel()
	_ = b.api.stop(ctx, id, true)
	if b.api.remove(ctx, id) == nil {
		b.live = slices.DeleteFunc(b.live, func(s string) bool { return s == id })
	}
}

// cleanup disposes of the sandboxes that a failed or interrupted run left.
func (b *bench) cleanup() {
	for _, id := range slices.Clone(b.live) {
		b.dispose(id)
	}
}

// spawn runs `bwrap <bwrapArgs>`, fails unless it exits 0, and returns the CPU time (user
// and system) of bwrap and of what it reaped, from wait4.
func spawn(ctx context.Context, bwrap string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, bwrap, bwrapArgs...) //nolint:gosec // the operator names the baseline binary (--bwrap, else bwrap on $PATH); the tool runs as they do
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("the bwrap baseline (%s): %w: %s", bwrap, err, strings.TrimSpace(string(out)))
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// seriesCPU counts the CPU time of one series of cycles: bothyd's tree from cpuTime at its
// start, bwrap's as its spawns return.
type seriesCPU struct {
	pid                    int
	startSelf, startReaped time.Duration
	bwrap                  time.Duration
	err                    error
}

// startCPU begins a series' count; without --pid it counts nothing.
func (b *bench) startCPU() *seriesCPU {
	c := &seriesCPU{pid: b.o.pid}
	if c.pid > 0 {
		c.startSelf, c.startReaped, c.err = cpuTimes(c.pid)
	}
	return c
}

// end is the series' CPU per cycle, nil without --pid.
func (c *seriesCPU) end(op string, cycles int, withBwrap bool) (*BenchCPU, error) {
	if c.pid == 0 {
		return nil, nil
	}
	self, reaped, err := cpuTimes(c.pid)
	if err = errors.Join(c.err, err); err != nil {
		return nil, fmt.Errorf("--pid %d: %w", c.pid, err)
	}
	n := float64(cycles)
	r := &BenchCPU{Op: op, Cycles: cycles, ServerMS: ms(self-c.startSelf) / n, ReapedMS: ms(reaped-c.startReaped) / n}
	r.MSPerCycle = r.ServerMS + r.ReapedMS
	if withBwrap {
		r.BwrapMS = ms(c.bwrap) / float64(cycles)
		if r.BwrapMS > 0 {
			r.XBwrap = r.MSPerCycle / r.BwrapMS
			met := r.XBwrap <= cpuGoalXBwrap
			r.Goal, r.Met = cpuGoalXBwrap, &met
		}
	}
	return r, nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func benchOp(name string, d []time.Duration, base time.Duration) BenchOp {
	s := slices.Clone(d)
	slices.Sort(s)
	op := BenchOp{Op: name, N: len(s), MedianMS: ms(s[len(s)/2]), P90MS: ms(quantile(s, 0.9))}
	if base > 0 {
		op.XBwrap = float64(s[len(s)/2]) / float64(base)
		if goal, ok := benchGoals[name]; ok {
			met := op.XBwrap <= goal
			op.Goal, op.Met = goal, &met
		}
	}
	return op
}

func (r *BenchReport) print(w io.Writer) {
	fmt.Fprintf(w, "bothyload bench %s: twice %d sequential full cycles, each followed by a bwrap spawn: with the server's ids (the first rows) and with ids of their own\n\n", r.URL, r.Cycles)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tn\tmedian ms\tp90 ms\t× bwrap\tgoal\tverdict\t")
	row := func(op BenchOp) {
		x, goal, verdict := "", "", ""
		if op.XBwrap > 0 {
			x = fmt.Sprintf("%.1f×", op.XBwrap)
		}
		if op.Met != nil {
			goal, verdict = fmt.Sprintf("≤ %.1f×", op.Goal), "missed"
			if *op.Met {
				verdict = "met"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%s\t%s\t%s\t\n", op.Op, op.N, op.MedianMS, op.P90MS, x, goal, verdict)
	}
	if r.Bwrap != nil {
		row(*r.Bwrap)
	}
	for _, op := range r.Ops {
		row(op)
	}
	_ = tw.Flush()
	if r.Bwrap == nil {
		fmt.Fprintln(w, "(no bwrap on $PATH: install bubblewrap for the baseline and the verdicts)")
	}
	for _, s := range r.Streams {
		verdict := "missed"
		if s.Met {
			verdict = "met"
		}
		fmt.Fprintf(w, "\nwebsocket stdout, %d vcpu(s), head -c %d /dev/zero: median of %d %.0f MB/s (goal ≥ %.0f MB/s: %s)",
			s.VCPUs, s.Bytes, s.N, s.MedianMBs, s.GoalMBs, verdict)
	}
	if len(r.Streams) > 0 {
		fmt.Fprintln(w)
	}
	if len(r.CPU) > 0 {
		fmt.Fprintln(w, "\nCPU time per cycle (bothyd and what it reaped, from /proc/<pid>/stat in 10 ms ticks) against a bwrap spawn's (wait4):")
	}
	for _, c := range r.CPU {
		fmt.Fprintf(w, "  %s: %.1f ms (bothyd %.1f, reaped %.1f)", c.Op, c.MSPerCycle, c.ServerMS, c.ReapedMS)
		if c.Met != nil {
			verdict := "missed"
			if *c.Met {
				verdict = "met"
			}
			fmt.Fprintf(w, ", %.1f× bwrap's %.2f ms (goal ≤ %.1f×: %s)", c.XBwrap, c.BwrapMS, c.Goal, verdict)
		}
		fmt.Fprintln(w)
	}
	if i := r.Idle; i != nil {
		verdict := "missed"
		if i.MiBEach <= i.GoalMiBEach {
			verdict = "met"
		}
		fmt.Fprintf(w, "\n%d idle sandboxes (no disk, 128 MiB limit), started by %d clients in %.1f s: host memory +%.0f MiB, %.2f MiB each %.0f s after the last start (goal ≤ %.0f MiB: %s), %.2f MiB each right after it\n",
			i.N, i.CreateClients, i.CreateS, i.HostMiB, i.MiBEach, idleSettle.Seconds(), i.GoalMiBEach, verdict, i.MiBEachAtStart)
		if i.PSSMiBEach != 0 {
			fmt.Fprintf(w, "of which the PSS of the processes below bothyd: %.2f MiB each\n", i.PSSMiBEach)
		}
		fmt.Fprintf(w, "with them: a listing of all %.0f ms, a page of 100 %.0f ms, exec of true median %.1f ms; deleted in %.1f s\n",
			i.ListAllMS, i.ListPageMS, i.ExecMedianMS, i.DeleteS)
	}
}
