package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// options are the command line.
type options struct {
	target
	clients      []int
	duration     time.Duration
	cycles       int
	mix          []mixEntry
	seed         uint64
	pid          int
	jsonOut      bool
	sandboxes    int
	streamBytes  int64
	cloneSize    int64
	waitMS       int
	timeout      time.Duration
	settle       time.Duration
	prefix       string
	expected     []string
	samplePeriod time.Duration
}

type mixEntry struct {
	kind   string
	weight int
}

var kinds = []string{"lifecycle", "exec", "stream", "clone"}

func main() {
	code, err := run(os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bothyload:", err)
	}
	os.Exit(code)
}

// run is the whole tool; it returns the exit status: 0 when every error was expected, 1 on a
// failure to run, 2 on bad usage, 3 when the load met unexpected errors.
func run(args []string, stdout, stderr io.Writer) (int, error) {
	if len(args) > 0 && args[0] == "bench" {
		return runBench(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "teardown" {
		return runTeardown(args[1:], stdout, stderr)
	}
	o, err := parseFlags(args, stderr)
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

	l := &load{o: o, api: newAPI(o.url, token, slices.Max(o.clients)), log: stderr}
	if err := l.api.waitForProbes(ctx, stderr); err != nil {
		return 1, err
	}
	rep, err := l.run(ctx)
	if rep != nil {
		if o.jsonOut {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		} else {
			rep.print(stdout)
		}
	}
	if err != nil {
		return 1, err
	}
	if rep.Unexpected > 0 {
		return 3, fmt.Errorf("%d unexpected errors", rep.Unexpected)
	}
	return 0, nil
}

// parseFlags reads the command line; a bad one is an error naming the flag to fix.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bothyload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var clients, mix, expected string
	o.flags(fs, "allow a URL that is not a loopback address")
	fs.StringVar(&clients, "clients", "1", "concurrent clients: a number or a list (1,2,4,8,16,32), one phase each")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each phase (ignored with --cycles)")
	fs.IntVar(&o.cycles, "cycles", 0, "cycles per phase instead of a duration")
	fs.StringVar(&mix, "mix", "lifecycle", "cycle kinds with optional weights: lifecycle, exec, stream, clone (e.g. lifecycle=1,exec=3)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the clients' choices")
	fs.IntVar(&o.pid, "pid", 0, "bothyd's pid: sample its RSS and open fds before, during and after")
	fs.BoolVar(&o.jsonOut, "json", false, "print the report as JSON")
	fs.IntVar(&o.sandboxes, "sandboxes", 0, "sandboxes started for exec and stream cycles (default: one per client)")
	fs.Int64Var(&o.streamBytes, "stream-bytes", 64<<20, "bytes a stream cycle reads (head -c N /dev/zero)")
	fs.Int64Var(&o.cloneSize, "clone-size", 1<<20, "bytes of data in the template generation that clone cycles use")
	fs.IntVar(&o.waitMS, "wait-ms", 0, "wait_ms of each exec (0: the server's default)")
	fs.DurationVar(&o.timeout, "request-timeout", 60*time.Second, "deadline of one request")
	fs.DurationVar(&o.settle, "settle", 10*time.Second, "after the load, how long to wait for the server's fds to return to their baseline")
	fs.StringVar(&o.prefix, "prefix", "", "prefix of the sandbox ids and template name (default: load-<random>)")
	fs.StringVar(&expected, "expect", "423 sandbox-busy", "comma-separated error keys that do not count as unexpected")
	fs.DurationVar(&o.samplePeriod, "sample-period", 200*time.Millisecond, "how often --pid is sampled during the load")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.clients, err = parseClients(clients); err != nil {
		return o, err
	}
	if o.mix, err = parseMix(mix); err != nil {
		return o, err
	}
	if err := o.validate(); err != nil {
		return o, err
	}
	for e := range strings.SplitSeq(expected, ",") {
		if e = strings.TrimSpace(e); e != "" {
			o.expected = append(o.expected, e)
		}
	}
	return o, nil
}

// target is the server a command measures, and the token it is called with.
type target struct {
	url, tokenFile, root string
	allowRemote          bool
}

// flags registers the target's flags; remoteHelp says what --allow-remote means for the command.
func (t *target) flags(fs *flag.FlagSet, remoteHelp string) {
	fs.StringVar(&t.url, "url", "http://127.0.0.1:7780", "bothyd base URL")
	fs.StringVar(&t.tokenFile, "token-file", os.Getenv("BOTHY_TOKEN_FILE"), "file holding the API token (env BOTHY_TOKEN_FILE); default: <root>/token")
	fs.StringVar(&t.root, "root", envOr("BOTHY_ROOT", ".bothy"), "bothyd's state root, whose token is used when --token-file is not given (env BOTHY_ROOT)")
	fs.BoolVar(&t.allowRemote, "allow-remote", false, remoteHelp)
}

// token checks the target's URL and reads the API token; on an error it also returns the
// command's exit code (2 for a URL the command line may not name, 1 for a token not read).
func (t *target) token() (string, int, error) {
	if err := checkTarget(t.url, t.allowRemote); err != nil {
		return "", 2, err
	}
	token, err := readToken(t.tokenFile, t.root)
	if err != nil {
		return "", 1, err
	}
	return token, 0, nil
}

// readToken is the API token: from tokenFile if one is given, else the one bothyd
// generated into its state root, else none (a server run with --insecure-no-auth).
func readToken(tokenFile, root string) (string, error) {
	name := tokenFile
	if name == "" {
		name = filepath.Join(root, "token")
	}
	b, err := os.ReadFile(name)
	switch {
	case err == nil:
		return strings.TrimSpace(string(b)), nil
	case tokenFile == "" && errors.Is(err, os.ErrNotExist):
		return "", nil
	case errors.Is(err, os.ErrPermission):
		return "", fmt.Errorf("reading the API token: %w (run as the user that runs bothyd, or give --token-file)", err)
	}
	return "", fmt.Errorf("reading the API token: %w", err)
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// parseClients reads --clients: one phase per number in the list.
func parseClients(list string) ([]int, error) {
	var clients []int
	for f := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1024 {
			return nil, fmt.Errorf("--clients: %q is not a number from 1 to 1024", f)
		}
		clients = append(clients, n)
	}
	return clients, nil
}

// parseMix reads --mix: cycle kinds, each with an optional weight (1 by default).
func parseMix(list string) ([]mixEntry, error) {
	var mix []mixEntry
	for f := range strings.SplitSeq(list, ",") {
		kind, w, hasW := strings.Cut(strings.TrimSpace(f), "=")
		e := mixEntry{kind: kind, weight: 1}
		if !slices.Contains(kinds, kind) {
			return nil, fmt.Errorf("--mix: unknown kind %q (want %s)", kind, strings.Join(kinds, ", "))
		}
		if hasW {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--mix: weight of %s must be a positive number", kind)
			}
			e.weight = n
		}
		mix = append(mix, e)
	}
	return mix, nil
}

// validate checks the bounds of the numeric flags and the prefix, choosing a random prefix
// when none was given.
func (o *options) validate() error {
	if o.cycles < 0 || (o.cycles == 0 && o.duration <= 0) {
		return errors.New("give a positive --duration or --cycles: a load run must end by itself")
	}
	if o.duration > 24*time.Hour {
		return errors.New("--duration is capped at 24h")
	}
	if o.streamBytes < 1 || o.cloneSize < 0 || o.timeout <= 0 || o.sandboxes < 0 || o.waitMS < 0 {
		return errors.New("--stream-bytes, --request-timeout must be positive; --clone-size, --sandboxes, --wait-ms not negative")
	}
	if o.prefix == "" {
		o.prefix = fmt.Sprintf("load-%04x", rand.Uint32()&0xffff)
	}
	if len(o.prefix) > 30 || strings.Trim(o.prefix, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return errors.New("--prefix: at most 30 characters of a-z, 0-9 and -")
	}
	return nil
}

// checkTarget refuses a URL whose host is not a loopback address, unless allowed.
func checkTarget(raw string, allowRemote bool) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--url %q: want http://host:port", raw)
	}
	if allowRemote {
		return nil
	}
	host := u.Hostname()
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		if ips, err = net.LookupIP(host); err != nil { //nolint:noctx // once, before the load
			return fmt.Errorf("--url: resolving %s: %w", host, err)
		}
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return fmt.Errorf("--url: %s is not a loopback address; pass --allow-remote to load another host", host)
		}
	}
	return nil
}

// Report is the whole run.
type Report struct {
	URL        string      `json:"url"`
	Seed       uint64      `json:"seed"`
	Mix        string      `json:"mix"`
	Phases     []Phase     `json:"phases"`
	Proc       *ProcReport `json:"proc,omitempty"`
	Unexpected int         `json:"unexpected_errors"`
}

// Phase is one level of concurrency.
type Phase struct {
	Clients         int     `json:"clients"`
	ElapsedSeconds  float64 `json:"elapsed_seconds"`
	Cycles          int     `json:"cycles"`
	CyclesPerSecond float64 `json:"cycles_per_second"`
	// ServerCPUMSPerCycle is the CPU time of bothyd and its reaped sandbox processes over the
	// phase, per cycle (with --pid): unlike latency, it hardly depends on what else the machine
	// runs. Sandboxes still running at the end (pools) are not counted.
	ServerCPUMSPerCycle float64    `json:"server_cpu_ms_per_cycle,omitempty"`
	Ops                 []OpReport `json:"ops"`
}

// ProcReport is the server's memory and descriptors around the load.
type ProcReport struct {
	PID    int        `json:"pid"`
	Before ProcSample `json:"before"`
	Peak   ProcSample `json:"peak"`
	After  ProcSample `json:"after"`
}

func (r *Report) print(w io.Writer) {
	fmt.Fprintf(w, "bothyload %s mix=%s seed=%d\n", r.URL, r.Mix, r.Seed)
	for _, p := range r.Phases {
		fmt.Fprintf(w, "\nclients=%d: %d cycles in %.1fs = %.1f cycles/s", p.Clients, p.Cycles, p.ElapsedSeconds, p.CyclesPerSecond)
		if p.ServerCPUMSPerCycle > 0 {
			fmt.Fprintf(w, ", bothyd CPU %.1f ms per cycle", p.ServerCPUMSPerCycle)
		}
		fmt.Fprintln(w)
		printTable(w, p.Ops)
	}
	if r.Proc != nil {
		p := r.Proc
		fmt.Fprintf(w, "\nbothyd pid %d: rss before %d KiB, peak %d KiB, after %d KiB; fds before %d, peak %d, after %d\n",
			p.PID, p.Before.RSSKiB, p.Peak.RSSKiB, p.After.RSSKiB, p.Before.FDs, p.Peak.FDs, p.After.FDs)
	}
	fmt.Fprintf(w, "unexpected errors: %d\n", r.Unexpected)
}

// load is one run of the tool.
type load struct {
	o   options
	api *api
	log io.Writer

	template string // the template clone cycles use, once prepared
	leftover sync.Map
}

func (l *load) run(ctx context.Context) (*Report, error) {
	var mixNames []string
	for _, e := range l.o.mix {
		mixNames = append(mixNames, e.kind+"="+strconv.Itoa(e.weight))
	}
	rep := &Report{URL: l.o.url, Seed: l.o.seed, Mix: strings.Join(mixNames, ",")}
	if l.o.pid > 0 {
		before, err := sampleProc(l.o.pid)
		if err != nil {
			return nil, fmt.Errorf("--pid: %w", err)
		}
		rep.Proc = &ProcReport{PID: l.o.pid, Before: before}
	}
	var watch *procWatch
	if l.o.pid > 0 {
		watch = watchProc(l.o.pid, l.o.samplePeriod)
	}
	runErr := l.phases(ctx, rep)
	l.cleanup()
	if watch != nil {
		peak, err := watch.end()
		if err != nil {
			runErr = errors.Join(runErr, err)
		}
		rep.Proc.Peak = peak
		// Our idle keep-alive connections hold descriptors in the server: close them, and give
		// the server up to --settle to notice.
		l.api.http.CloseIdleConnections()
		deadline := time.Now().Add(l.o.settle)
		for {
			after, err := sampleProc(l.o.pid)
			if err != nil {
				runErr = errors.Join(runErr, err)
				break
			}
			rep.Proc.After = after
			if after.FDs <= rep.Proc.Before.FDs || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, p := range rep.Phases {
		for _, op := range p.Ops {
			for k, n := range op.Errors {
				if !slices.Contains(l.o.expected, k) {
					rep.Unexpected += n
				}
			}
		}
	}
	return rep, runErr
}

// phases runs one phase per --clients entry, after preparing the template when the mix
// clones, and appends each phase's result to rep.
func (l *load) phases(ctx context.Context, rep *Report) error {
	needPool, needTemplate := false, false
	for _, e := range l.o.mix {
		needPool = needPool || e.kind == "exec" || e.kind == "stream"
		needTemplate = needTemplate || e.kind == "clone"
	}
	if needTemplate {
		if err := l.prepareTemplate(ctx); err != nil {
			return fmt.Errorf("preparing the template: %w", err)
		}
	}
	for pi, clients := range l.o.clients {
		var pool []string
		if needPool {
			var err error
			if pool, err = l.startPool(ctx, pi, clients); err != nil {
				return err
			}
		}
		phase := l.phase(ctx, pi, clients, pool)
		for _, id := range pool {
			l.dispose(id)
		}
		rep.Phases = append(rep.Phases, phase)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// startPool starts the running sandboxes that phase pi's exec and stream cycles use: as many
// as --sandboxes, or one per client. Each is a leftover until disposed of, so that a failure
// half-way leaves nothing behind after cleanup.
func (l *load) startPool(ctx context.Context, pi, clients int) ([]string, error) {
	n := l.o.sandboxes
	if n == 0 {
		n = clients
	}
	var pool []string
	for i := range n {
		id := fmt.Sprintf("%s-p%d-%d", l.o.prefix, pi, i)
		l.leftover.Store(id, true)
		rctx, cancel := context.WithTimeout(ctx, l.o.timeout)
		err := l.api.create(rctx, map[string]any{"id": id, "start": true})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("starting pool sandbox %s: %w", id, err)
		}
		pool = append(pool, id)
	}
	return pool, nil
}

// phase runs phase pi: clients concurrent clients cycling until --cycles cycles were
// claimed or --duration passed, and measures it.
func (l *load) phase(ctx context.Context, pi, clients int, pool []string) Phase {
	rec := newRecorder()
	var cpu0 time.Duration
	if l.o.pid > 0 {
		cpu0, _ = cpuTime(l.o.pid)
	}
	var claimed, done atomic.Int64
	var deadline time.Time
	if l.o.cycles == 0 {
		deadline = time.Now().Add(l.o.duration)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() { l.client(ctx, rec, pi, c, pool, deadline, &claimed, &done) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	phase := Phase{
		Clients:         clients,
		ElapsedSeconds:  elapsed.Seconds(),
		Cycles:          int(done.Load()),
		CyclesPerSecond: float64(done.Load()) / elapsed.Seconds(),
		Ops:             rec.report(elapsed),
	}
	if l.o.pid > 0 && phase.Cycles > 0 {
		if cpu1, err := cpuTime(l.o.pid); err == nil && cpu0 > 0 {
			phase.ServerCPUMSPerCycle = float64((cpu1 - cpu0).Microseconds()) / 1000 / float64(phase.Cycles)
		}
	}
	return phase
}

// client is client c of phase pi: it runs cycles of kinds drawn from its own seeded stream
// until the phase's cycles are all claimed (with --cycles), its deadline passes, or ctx
// ends, and counts in done those that succeeded. Its exec and stream cycles use one pool
// sandbox.
func (l *load) client(ctx context.Context, rec *recorder, pi, c int, pool []string, deadline time.Time, claimed, done *atomic.Int64) {
	rng := rand.New(rand.NewPCG(l.o.seed, uint64(pi)<<32|uint64(c)))
	for n := 0; ctx.Err() == nil; n++ {
		if l.o.cycles > 0 {
			if claimed.Add(1) > int64(l.o.cycles) {
				return
			}
		} else if time.Now().After(deadline) {
			return
		}
		id := fmt.Sprintf("%s-%d-%d-%d", l.o.prefix, pi, c, n)
		var target string
		if len(pool) > 0 {
			target = pool[c%len(pool)]
		}
		if l.cycle(ctx, rec, l.pick(rng), id, target) {
			done.Add(1)
		}
	}
}

// pick draws a cycle kind by weight.
func (l *load) pick(rng *rand.Rand) string {
	total := 0
	for _, e := range l.o.mix {
		total += e.weight
	}
	n := rng.IntN(total)
	for _, e := range l.o.mix {
		if n < e.weight {
			return e.kind
		}
		n -= e.weight
	}
	return l.o.mix[0].kind
}

// step times one request of a cycle; it reports whether it succeeded.
func (l *load) step(ctx context.Context, rec *recorder, cycleOp, op string, f func(context.Context) (int64, error)) bool {
	rctx, cancel := context.WithTimeout(ctx, l.o.timeout)
	defer cancel()
	t0 := time.Now()
	n, err := f(rctx)
	if err != nil {
		if ctx.Err() != nil {
			return false // interrupted: not a server error
		}
		rec.fail(op, errKey(err))
		if op != cycleOp {
			rec.fail(cycleOp, errKey(err))
		}
		return false
	}
	rec.ok(op, time.Since(t0), n)
	return true
}

// cycle runs one cycle of kind; id names a sandbox it may create, target a pool sandbox.
func (l *load) cycle(ctx context.Context, rec *recorder, kind, id, target string) bool {
	t0 := time.Now()
	none := func(err error) (int64, error) { return 0, err }
	ok := true
	switch kind {
	case "lifecycle", "clone":
		l.leftover.Store(id, true)
		if kind == "lifecycle" {
			ok = l.step(ctx, rec, kind, "create", func(c context.Context) (int64, error) {
				return none(l.api.create(c, map[string]any{"id": id}))
			}) && l.step(ctx, rec, kind, "start", func(c context.Context) (int64, error) { return none(l.api.start(c, id)) })
		} else {
			ok = l.step(ctx, rec, kind, "clone-create", func(c context.Context) (int64, error) {
				return none(l.api.create(c, map[string]any{"id": id, "template": l.template, "start": true}))
			})
		}
		ok = ok && l.step(ctx, rec, kind, "exec-true", func(c context.Context) (int64, error) {
			_, err := l.api.exec(c, id, []string{"true"}, "", l.o.waitMS)
			return none(err)
		}) && l.step(ctx, rec, kind, "stop", func(c context.Context) (int64, error) { return none(l.api.stop(c, id, false)) }) &&
			l.step(ctx, rec, kind, "delete", func(c context.Context) (int64, error) { return none(l.api.remove(c, id)) })
		if ok {
			l.leftover.Delete(id)
		} else {
			l.dispose(id)
		}
	case "exec":
		return l.step(ctx, rec, kind, "exec", func(c context.Context) (int64, error) {
			_, err := l.api.exec(c, target, []string{"true"}, "", l.o.waitMS)
			return none(err)
		})
	case "stream":
		return l.step(ctx, rec, kind, "stream", func(c context.Context) (int64, error) {
			n, err := l.api.stream(c, target, []string{"head", "-c", strconv.FormatInt(l.o.streamBytes, 10), "/dev/zero"}, l.o.waitMS)
			if err == nil && n != l.o.streamBytes {
				err = fmt.Errorf("stream: %d bytes, want %d", n, l.o.streamBytes)
			}
			return n, err
		})
	}
	if ok {
		rec.ok(kind, time.Since(t0), 0)
	}
	return ok
}

// prepareTemplate captures a generation holding --clone-size bytes for clone cycles.
func (l *load) prepareTemplate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	src := l.o.prefix + "-tsrc"
	l.template = l.o.prefix + "-tpl"
	l.leftover.Store(src, true)
	if err := l.api.create(ctx, map[string]any{"id": src, "start": true}); err != nil {
		return err
	}
	if l.o.cloneSize > 0 {
		cmd := fmt.Sprintf("head -c %d /dev/urandom > /home/user/blob", l.o.cloneSize)
		if _, err := l.api.exec(ctx, src, []string{"sh", "-c", cmd}, "", 0); err != nil {
			return err
		}
	}
	if err := l.api.stop(ctx, src, false); err != nil {
		return err
	}
	if err := l.api.call(ctx, "POST", "/v1/templates", map[string]any{"name": l.template}, nil, 201); err != nil {
		return err
	}
	return l.api.call(ctx, "POST", "/v1/templates/"+l.template+"/generations", map[string]any{"sandbox": src}, nil, 201)
}

// dispose stops (forcibly) and deletes a sandbox the load made, best effort.
func (l *load) dispose(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*l.o.timeout)
	defer cancel()
	_ = l.api.stop(ctx, id, true)
	if err := l.api.remove(ctx, id); err == nil || errKey(err) == "404 sandbox-not-found" {
		l.leftover.Delete(id)
	}
}

// cleanup removes what the run left: sandboxes of failed cycles, the pools, the template.
func (l *load) cleanup() {
	l.leftover.Range(func(k, _ any) bool {
		l.dispose(k.(string))
		return true
	})
	if l.template != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*l.o.timeout)
		defer cancel()
		if err := l.api.call(ctx, "DELETE", "/v1/templates/"+l.template, nil, nil, 204); err != nil {
			fmt.Fprintf(l.log, "bothyload: deleting template %s: %v\n", l.template, err)
		}
	}
	var left []string
	l.leftover.Range(func(k, _ any) bool { left = append(left, k.(string)); return true })
	if len(left) > 0 {
		fmt.Fprintf(l.log, "bothyload: could not remove %s\n", strings.Join(left, ", "))
	}
}
