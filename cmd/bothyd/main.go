// Command bothyd serves the bothyd API and dashboard. The same binary is also the runtime's
// shim and the in-sandbox init and agent, as hidden sub-commands, so that one binary is enough.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bothy/bothy/runtime"
	vmshim "github.com/bothy/bothy/runtime/microvm/shim"
	"github.com/bothy/bothy/runtime/namespace/shim"

	"github.com/lmittmann/tint"

	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/e2b"
	"github.com/bothy/bothy/events"
	"github.com/bothy/bothy/handlers"
	"github.com/bothy/bothy/idle"
	"github.com/bothy/bothy/internal/ratelog"
	"github.com/bothy/bothy/internal/systemd"
	"github.com/bothy/bothy/metrics"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/server"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
	"github.com/bothy/bothy/supervisor"
	"github.com/bothy/bothy/usage"
	"github.com/bothy/bothy/web"
)

// version is set at build time with -ldflags "-X main.version=..." (scripts/package, the
// Dockerfile); `go install …/cmd/bothyd@v1.2.3` leaves it "dev" and the module version
// recorded in the binary says it instead (moduleVersion).
var version = "dev"

func main() {
	if code, ran := shim.Main(os.Args[1:]); ran {
		os.Exit(code)
	}
	if code, ran := vmshim.Main(os.Args[1:]); ran {
		os.Exit(code)
	}
	version = moduleVersion(version)
	os.Exit(run(os.Args[1:], os.Stderr))
}

// moduleVersion is v, or, when v is the default "dev", the version of the module this binary
// was built from when the toolchain recorded one (go install of a tagged version).
func moduleVersion(v string) string {
	if v != "dev" {
		return v
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return v
}

// options are the command line, each flag with an environment variable as its default.
type options struct {
	listen         string
	root           string
	tokenFile      string
	tokenGroup     string // a group whose members may read the generated token
	insecureNoAuth bool
	logFormat      string
	logLevel       string
	// sandboxMetrics exports per-sandbox series on /metrics, at most sandboxMetricsMax.
	sandboxMetrics    bool
	sandboxMetricsMax int
	allowedOrigins    stringList
	templateMaxAge    time.Duration
	runtime           *runtimeOptions
	defaultDiskMB     int
	defaultTimeout    int // seconds
	// spares is how many started sandboxes are kept ready for creates (supervisor/spares.go);
	// sparesExplicit says the operator chose it.
	spares         int
	sparesExplicit bool
	// registryAuth and insecureRegistries configure image pulls.
	registryAuth       string
	insecureRegistries stringList
	// registryMirror is where pulls from Docker Hub go first.
	registryMirror string
	// templateRegistry is the OCI repository template generations are pushed to and
	// pulled from (store/template/registry); empty: generations stay on this node.
	templateRegistry string
	// diskExplicit says the operator chose defaultDiskMB (flag or environment), so a host
	// that cannot give sandboxes a disk is an error rather than a warning.
	diskExplicit bool
	// networkPool, networkUplink and dnsUpstream configure sandbox networks (network.Config).
	networkPool, networkUplink, dnsUpstream string
	// webhookAllowPrivate lets webhook deliveries reach private addresses (webhook.Options).
	webhookAllowPrivate bool
	// webhookResolver is the DNS server webhook deliveries resolve through (webhook.Options).
	webhookResolver string
	// checkpointMax and checkpointMaxBytes bound each sandbox's checkpoints (checkpoint.Limits).
	checkpointMax      int
	checkpointMaxBytes int64
	// cluster is node mode (cluster.go, docs/cluster.md).
	cluster *clusterOptions
	// egressCAFile names a CA file the egress proxy trusts besides the host's roots.
	egressCAFile string
}

// boundedDiskMB is the disk of its own that a sandbox gets when neither its create request nor
// the operator names one: every sandbox's writes are bounded by default, so that no workload
// can fill the state root's file system. The image is sparse and its metadata made lazily, so
// an unused disk costs about 0.7 MiB of the host's disk and a create about 10 ms.
const boundedDiskMB = 1024

// defaultSpares is how many spares a server keeps when the operator does not say: enough for
// one client's creates one after the other (a claim starts the next spare, which is ready
// before that client's next create in the usual cycle), at about 3 MiB of memory each.
const defaultSpares = 2

// maxSpares bounds --spares: a spare is a running sandbox.
const maxSpares = 64

// defaultSandboxMetricsMax bounds the sandbox label of --sandbox-metrics' series by default.
const defaultSandboxMetricsMax = 100

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bothyd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", envOr("BOTHY_LISTEN", "127.0.0.1:7780"), "address to serve on (env BOTHY_LISTEN); off loopback a token is required")
	fs.StringVar(&o.root, "root", envOr("BOTHY_ROOT", ".bothy"), "state root (env BOTHY_ROOT)")
	fs.StringVar(&o.tokenFile, "token-file", os.Getenv("BOTHY_TOKEN_FILE"), "file holding the API token (env BOTHY_TOKEN_FILE); default: one generated into <root>/token")
	fs.StringVar(&o.tokenGroup, "token-group", os.Getenv("BOTHY_TOKEN_GROUP"), "a group whose members may read the generated token, and so use the bothy CLI as themselves (env BOTHY_TOKEN_GROUP): the token becomes mode 0640 in that group and the state root 0710 in that group, which lets them reach the token but list and read nothing else; default: the token is the owner's alone")
	fs.BoolVar(&o.insecureNoAuth, "insecure-no-auth", false, "serve without a token, on loopback only: any user of this host can then drive sandboxes; for a trusted single-user host")
	fs.StringVar(&o.logFormat, "log-format", envOr("BOTHY_LOG_FORMAT", "auto"), "log format: auto (coloured text on a terminal, journal under systemd, JSON otherwise), text, journal (text with syslog priorities and no time, for the journal) or json (env BOTHY_LOG_FORMAT)")
	fs.StringVar(&o.logLevel, "log-level", envOr("BOTHY_LOG_LEVEL", "info"), "log level: debug, info, warn or error (env BOTHY_LOG_LEVEL)")
	maxAge, err := envParsed("BOTHY_TEMPLATE_MAX_AGE", template.DefaultMaxAge, time.ParseDuration)
	if err != nil {
		return nil, err
	}
	fs.DurationVar(&o.templateMaxAge, "template-max-age", maxAge, "how long after its capture a template generation can be cloned (env BOTHY_TEMPLATE_MAX_AGE)")
	if o.runtime, err = addRuntimeFlags(fs); err != nil {
		return nil, err
	}
	diskMB, err := envParsed("BOTHY_DEFAULT_DISK_MB", boundedDiskMB, strconv.Atoi)
	if err != nil {
		return nil, err
	}
	fs.IntVar(&o.defaultDiskMB, "default-disk-mb", diskMB, "the disk of its own, in MiB, that a sandbox gets when its create request names none; 0: none, so sandboxes write to the state root's file system unbounded, for trusted work only (env BOTHY_DEFAULT_DISK_MB)")
	fs.StringVar(&o.registryAuth, "registry-auth", os.Getenv("BOTHY_REGISTRY_AUTH"), "a docker-style config.json whose auths entries give the credentials of image registries (env BOTHY_REGISTRY_AUTH); default: anonymous pulls")
	fs.StringVar(&o.registryMirror, "registry-mirror", os.Getenv("BOTHY_REGISTRY_MIRROR"), "a registry (host or host:port) that pulls from Docker Hub go to first, falling back to Docker Hub when it lacks the image or is unreachable (env BOTHY_REGISTRY_MIRROR)")
	fs.StringVar(&o.templateRegistry, "template-registry", os.Getenv("BOTHY_TEMPLATE_REGISTRY"), "an OCI repository (host[:port]/path) that every captured template generation is pushed to, and that a clone of a generation this node lacks pulls it from; credentials come from --registry-auth (env BOTHY_TEMPLATE_REGISTRY); default: generations stay on their node")
	fs.Var(&o.insecureRegistries, "insecure-registry", "a registry (host or host:port) pulled from over plain HTTP; loopback registries always are; repeatable")
	timeoutS, err := envParsed("BOTHY_DEFAULT_TIMEOUT_S", 0, strconv.Atoi)
	if err != nil {
		return nil, err
	}
	fs.IntVar(&o.defaultTimeout, "default-timeout-s", timeoutS, "the lifetime in seconds of a sandbox whose create request names none; 0: none (env BOTHY_DEFAULT_TIMEOUT_S)")
	spares, err := envParsed("BOTHY_SPARES", defaultSpares, strconv.Atoi)
	if err != nil {
		return nil, err
	}
	fs.IntVar(&o.spares, "spares", spares, "how many sandboxes with the default settings are kept started ahead, so that a create with start that names no id, image, limits, environment or network gets one at once; 0: none (env BOTHY_SPARES)")
	fs.StringVar(&o.networkPool, "network-pool", envOr("BOTHY_NETWORK_POOL", network.DefaultPool.String()), "the IPv4 range sandbox addresses come from, a /30 each (env BOTHY_NETWORK_POOL)")
	fs.StringVar(&o.networkUplink, "network-uplink", os.Getenv("BOTHY_NETWORK_UPLINK"), "the only interface sandbox traffic leaves by, masqueraded (env BOTHY_NETWORK_UPLINK); default: any interface that is not a sandbox's")
	fs.StringVar(&o.dnsUpstream, "dns-upstream", os.Getenv("BOTHY_DNS_UPSTREAM"), "the resolver (host:port) that sandboxes' allowed names are forwarded to (env BOTHY_DNS_UPSTREAM); default: the first nameserver of /etc/resolv.conf")
	fs.StringVar(&o.egressCAFile, "egress-ca-file", os.Getenv("BOTHY_EGRESS_CA_FILE"), "a PEM file of CA certificates the egress proxy trusts, besides the host's roots, when it connects to a host a secret is bound to (env BOTHY_EGRESS_CA_FILE); for hosts with a private CA, and tests")
	fs.StringVar(&o.webhookResolver, "webhook-resolver", os.Getenv("BOTHY_WEBHOOK_RESOLVER"), "the DNS server (host:port) through which webhook deliveries resolve their receivers' names, for a split horizon (env BOTHY_WEBHOOK_RESOLVER); default: the host's resolvers")
	fs.BoolVar(&o.webhookAllowPrivate, "webhook-allow-private", os.Getenv("BOTHY_WEBHOOK_ALLOW_PRIVATE") == "1", "let webhook deliveries reach loopback, link-local, private (RFC 1918, ULA) and sandbox addresses, for receivers on this host or its network (env BOTHY_WEBHOOK_ALLOW_PRIVATE=1); default: only public addresses, checked on the address connected to")
	fs.BoolVar(&o.sandboxMetrics, "sandbox-metrics", os.Getenv("BOTHY_SANDBOX_METRICS") == "1", "export each running sandbox's usage on /metrics as series labelled by its id (env BOTHY_SANDBOX_METRICS=1); off by default: the series grow with the sandboxes")
	fs.IntVar(&o.sandboxMetricsMax, "sandbox-metrics-max", defaultSandboxMetricsMax, "the most sandboxes --sandbox-metrics exports, the first by id; bothy_sandbox_series_truncated says when more ran")
	fs.IntVar(&o.checkpointMax, "checkpoint-max", checkpoint.DefaultCount, "the most checkpoints one sandbox holds (docs/checkpoints.md)")
	fs.Int64Var(&o.checkpointMaxBytes, "checkpoint-max-bytes", checkpoint.DefaultBytes, "the most bytes the checkpoints of one sandbox hold together")
	fs.Var(&o.allowedOrigins, "allowed-origin", "a browser origin (scheme://host:port) allowed to call the API besides the server's own; repeatable")
	if o.cluster, err = addClusterFlags(fs); err != nil {
		return nil, err
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := o.cluster.check(); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.runtime.noteCgroupParentSource(fs)
	_, o.diskExplicit = os.LookupEnv("BOTHY_DEFAULT_DISK_MB")
	fs.Visit(func(f *flag.Flag) { o.diskExplicit = o.diskExplicit || f.Name == "default-disk-mb" })
	_, o.sparesExplicit = os.LookupEnv("BOTHY_SPARES")
	fs.Visit(func(f *flag.Flag) { o.sparesExplicit = o.sparesExplicit || f.Name == "spares" })
	if err := o.checkRanges(); err != nil {
		return nil, err
	}
	return o, nil
}

// checkRanges refuses the numeric and address options out of their ranges, naming the flag.
func (o *options) checkRanges() error {
	if o.defaultDiskMB != 0 && (o.defaultDiskMB < 32 || o.defaultDiskMB > 1<<20) {
		return fmt.Errorf("--default-disk-mb %d: want 0 (none) or 32 to 1048576", o.defaultDiskMB)
	}
	if o.spares < 0 || o.spares > maxSpares {
		return fmt.Errorf("--spares %d: want 0 (none) to %d", o.spares, maxSpares)
	}
	if o.sandboxMetricsMax < 1 || o.sandboxMetricsMax > 10000 {
		return fmt.Errorf("--sandbox-metrics-max %d: want 1 to 10000", o.sandboxMetricsMax)
	}
	if o.checkpointMax < 1 || o.checkpointMax > 256 {
		return fmt.Errorf("--checkpoint-max %d: want 1 to 256 (each checkpoint is a layer of the sandbox's overlay)", o.checkpointMax)
	}
	if o.checkpointMaxBytes < 1 {
		return fmt.Errorf("--checkpoint-max-bytes %d: want a positive number of bytes", o.checkpointMaxBytes)
	}
	if o.webhookResolver != "" {
		if _, err := netip.ParseAddrPort(o.webhookResolver); err != nil {
			return fmt.Errorf("--webhook-resolver %q: want an IP address and a port, such as 10.0.0.53:53", o.webhookResolver)
		}
	}
	if o.defaultTimeout < 0 || o.defaultTimeout > 30*24*3600 {
		return fmt.Errorf("--default-timeout-s %d: want 0 (none) or 1 to 2592000 (30 days)", o.defaultTimeout)
	}
	return nil
}

// envParsed is the environment variable name parsed by parse, or def when it is not set.
func envParsed[T any](name string, def T, parse func(string) (T, error)) (T, error) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def, nil
	}
	x, err := parse(v)
	if err != nil {
		return def, fmt.Errorf("%s=%q: %v", name, v, err)
	}
	return x, nil
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func run(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "healthcheck" {
		return healthcheck(stderr)
	}
	if len(args) > 0 && args[0] == "check" {
		return checkCommand(args[1:], os.Stdout, stderr)
	}
	if len(args) > 0 && args[0] == "hold" {
		return holdCommand(args[1:], stderr)
	}
	if len(args) > 0 && args[0] == "router" {
		return routerCommand(args[1:], stderr)
	}
	if len(args) > 0 && args[0] == "controller" {
		return controllerCommand(args[1:], stderr)
	}
	o, err := parseOptions(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "bothyd:", err)
		return 2
	}
	log, err := newLogger(o.logFormat, o.logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd:", err)
		return 2
	}
	if err := serve(o, log); err != nil {
		log.Error("bothyd stopped", "err", err)
		return 1
	}
	return 0
}

func serve(o *options, log *slog.Logger) error {
	token, auth, err := apiToken(o, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen) //nolint:noctx // start-up: no request to end it
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := server.CheckListener(ln, token); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	noFile := raiseNoFile(log)
	st, err := store.Open(o.root)
	if err != nil {
		return err
	}
	defer st.Close()
	recorded, err := settleCgroupParent(o.runtime, o.root)
	if err != nil {
		return err
	}
	rts, err := newRuntimes(*o.runtime, o.root, log)
	if err != nil {
		return err
	}
	// Before any sandbox starts or is reattached below it: the state root records where its
	// sandboxes' cgroups are, for `bothyd check` and the next start (cgroupparent.go).
	if err := recordCgroupParent(o.root, o.runtime, recorded, log); err != nil {
		return err
	}
	rt := rts.def
	// Before anything starts a sandbox: a shim whose launch ends hands its release here
	// rather than start a releaser process (docs/design.md, "The release"). Without the
	// socket the shims start releasers, which costs CPU but nothing else.
	if stopReleases, err := rt.ServeReleases(func(err error) { log.Warn("a release hand-off refused", "err", err) }); err != nil {
		log.Warn("shims will start releaser processes: the release socket", "err", err)
	} else {
		defer stopReleases()
	}
	logRuntimes(o, rts, log)
	if o.defaultDiskMB, err = defaultDisk(rt, o, log); err != nil {
		return err
	}
	// The event bus and the metrics observe the supervisor through its hooks; the metrics
	// count sandboxes by state from the supervisor itself, at scrape time.
	var sup *supervisor.Supervisor
	hooks, egressSvc, err := openOutbound(o, secretUses(&sup), log)
	if err != nil {
		return err
	}
	defer hooks.Close()
	bus, err := events.Open(events.Options{SeqDir: o.root, OnError: func(err error) {
		log.Warn("event ids may be reused after a restart", "err", err)
	}, OnPublish: hooks.Enqueue})
	if err != nil {
		return fmt.Errorf("the event sequence record: %w", err)
	}
	mx := metrics.New(func() ([]*supervisor.Status, error) { return sup.List() }, log)
	// The state root's health: every fault is counted, a change of state logged once.
	health := supervisor.NewStorageHealth(st.Root(), log, mx.OnStorageFault)
	defer health.Close()
	ts, generations, err := openTemplates(o)
	if err != nil {
		return err
	}
	netw, err := openNetwork(o, egressSvc, log)
	if err != nil {
		return err
	}
	if netw != nil {
		defer netw.Close()
		mx.WatchNetwork(netw.denied)
		go netw.watch(ctx)
	}
	vols := openVolumes(o.root, st, log)
	images, err := openImages(ctx, o, log)
	if err != nil {
		return err
	}
	defer images.Close()
	// Node mode follows the supervisor's events from the first (cluster.go).
	actions := &objectActions{sup: &sup}
	clusterNode, err := newClusterNode(o.cluster, ln.Addr(), &sup, vols, egressSvc.secrets, actions, health, log)
	if err != nil {
		return err
	}
	sup, err = supervisor.New(supervisor.Options{
		Store: st, Runtime: rt, Runtimes: rts.others, Unavailable: rts.unavailable,
		Templates: ts, Generations: notifyPulls(generations, clusterNode.GenerationsChanged), Images: images, Logger: log,
		OnEvent: func(e supervisor.Event) {
			mx.OnEvent(e.Type)
			bus.Publish(handlers.EventOf(e))
			clusterNode.OnEvent(e) // nil, and so nothing, unless --cluster-node
		},
		OnTransition: mx.OnTransition,
		Storage:      health,
		Network:      netw.networker(),
		Secrets:      egressSvc,
		Spares:       spareOptions(o, rt, log),
		Volumes:      vols,
		Checkpoints:  checkpoint.Limits{Count: o.checkpointMax, Bytes: o.checkpointMaxBytes},
		CrashPoint:   crashPoint(),
		// Node mode enforces the capacity the node publishes (cluster/node/admission.go).
		CreateAdmission: clusterNode.Admission(),
	})
	if err != nil {
		return err
	}
	defer sup.Close()
	mx.WatchSpares(sup.SpareStats)
	// A runtime's probe (the microvm runtime boots a guest to choose its accelerator) takes
	// seconds: it runs while the server serves, and /v1/info says probing meanwhile.
	sup.ProbeRuntimes()
	// Reconcile every sandbox: interrupted starts end, stale records clear, running sandboxes
	// are found again. It runs while the server serves; an operation on a sandbox that it has
	// not reached yet reconciles that sandbox first.
	if err := sup.StartReattach(ctx, 10*time.Second); err != nil {
		return err
	}
	sup.StartSpares()
	go syncTombstones(ctx, sup, generations, log)
	// After the start-up reattach has begun: the node's reconcile reads each sandbox through
	// the supervisor, which settles one it has not reached yet first.
	defer runClusterNode(ctx, clusterNode, log)()
	sampler := watchUsage(ctx, o, sup, netw, mx, log)
	linkNode := ""
	if o.cluster.enabled {
		linkNode = o.cluster.nodeName
	}
	links, idem, err := openRecords(o.root, linkNode, log)
	if err != nil {
		return err
	}
	// Every line a remote client can cause (access log, refusals, E2B's and the handlers'
	// lines) goes through a rate limit per message (issue 37): a flood cannot fill the log.
	rlog := ratelog.Logger(log)
	h, err := handlers.New(handlers.Config{
		Supervisor:       sup,
		DefaultResources: store.Resources(namespace.DefaultResources),
		DefaultDiskMB:    o.defaultDiskMB,
		DefaultTimeoutS:  o.defaultTimeout,
		Version:          version,
		MaxGenerationAge: o.templateMaxAge,
		MaxJSONBytes:     server.DefaultMaxJSONBytes,
		MaxFileBytes:     server.DefaultMaxFileBytes,
		Logger:           rlog,
		Events:           bus,
		Images:           sup,
		OnExec:           mx.OnExec,
		Storage:          health.Status,
		HostFirewall:     netw.hostFirewall(),
		NoFileLimit:      noFile,
		Links:            links,
		Webhooks:         hooks,
		Secrets:          clusterSecrets{egressSvc.secrets, clusterNode},
		Usage:            sampler,
		Volumes:          vols,
	})
	if err != nil {
		return err
	}
	actions.h.Store(h) // node mode may create sandboxes from Sandbox objects from now on
	// E2B's API on the same listener (docs/e2b.md): its paths and its envd header are none
	// of bothyd's.
	e2bAPI := e2b.New(e2b.Config{
		Supervisor: sup, Token: token, Logger: rlog,
		Resources: store.Resources(namespace.DefaultResources), DiskMB: o.defaultDiskMB,
		MaxFileBytes: server.DefaultMaxFileBytes, Usage: sampler, Volumes: vols, Secrets: clusterSecrets{egressSvc.secrets, clusterNode},
	})
	srv, err := server.New(server.Config{
		Foreign:        e2bAPI,
		ForeignClaims:  e2b.Claims,
		ForeignUpload:  e2b.IsUpload,
		ForeignStream:  e2b.IsStream,
		MaxConns:       maxConns(noFile),
		Handlers:       h,
		Token:          token,
		AllowedOrigins: o.allowedOrigins,
		Logger:         rlog,
		ExecStream:     h.ExecStream,
		Events:         h.BoundEvents((&events.Handler{Bus: bus, Logger: rlog}).ServeEvents),
		Metrics:        mx.Handler(),
		Dashboard:      web.Handler(),
		OnProblem:      mx.OnProblem,
		ClassifyError:  health.Classify,
		Idempotency:    idem,
		Ports:          server.PortRoutes{Proxy: h.PortProxy, Tunnel: h.PortTunnel, Link: h.LinkProxy},
	})
	if err != nil {
		return err
	}
	hooks.Start()
	srv.OnShutdown(h.CloseStreams)
	srv.OnShutdown(bus.Close)
	root, _ := filepath.Abs(o.root) // the default root is relative: say where it is
	log.Info("bothyd serving", "addr", ln.Addr().String(), "root", root, "version", version, "token", token != "", "auth", auth)
	if token != "" {
		if err := logLogin(srv, ln.Addr(), log); err != nil {
			return err
		}
	}
	// systemd (Type=notify) learns that bothyd serves once /healthz answers, and that it stops
	// as soon as it begins to; off systemd both do nothing.
	go notifyReady(ctx, ln.Addr(), log)
	go func() {
		<-ctx.Done()
		notifyStopping(log)
	}()
	err = srv.Serve(ctx, ln)
	log.Info("bothyd shut down")
	return err
}

// logRuntimes says which runtime serves, with which kernel mechanisms, and which runtimes
// take no new sandboxes and why.
func logRuntimes(o *options, rts *runtimeSet, log *slog.Logger) {
	rt := rts.def
	log.Info("sandbox runtime", "executable", rts.exe, "user_namespaces", o.runtime.userNamespaces, "cgroup_parent", o.runtime.cgroupParent)
	mech := rt.Mechanisms()
	log.Info("namespace runtime: kernel mechanisms", "kernel", mech.Kernel, "overlay_layers", mech.OverlayLayers,
		"tmpfs_ownership", mech.TmpfsOwnership, "forced", mech.Forced)
	for _, note := range rt.ProbeNotes() {
		log.Info("namespace runtime: a better mechanism is missing here", "probe", note)
	}
	for kind, why := range rts.unavailable {
		log.Info("runtime: takes no new sandboxes", "runtime", kind, "reason", why)
	}
}

// openTemplates opens the template store with the operator's maximum generation age, and
// the template registry --template-registry names (nil: none).
func openTemplates(o *options) (*template.Store, supervisor.GenerationRegistry, error) {
	if o.templateMaxAge <= 0 {
		return nil, nil, fmt.Errorf("--template-max-age must be positive")
	}
	ts, err := template.Open(o.root, template.Options{MaxAge: o.templateMaxAge})
	if err != nil {
		return nil, nil, err
	}
	generations, err := openTemplateRegistry(o, ts)
	if err != nil {
		ts.Close()
		return nil, nil, err
	}
	return ts, generations, nil
}

// watchUsage starts what watches the running sandboxes: the sampler of every running
// sandbox's usage (a fixed interval, a bounded history) for GET /v1/sandboxes/{id}/metrics,
// E2B's metrics and, with --sandbox-metrics, /metrics; and the idle watch that puts sandboxes
// with a sleep policy to sleep once idle for their timeout (package idle, the supervisor's
// sleep.go; a request that needs one wakes it).
func watchUsage(ctx context.Context, o *options, sup *supervisor.Supervisor, netw *netAccount, mx *metrics.Metrics, log *slog.Logger) *usage.Sampler {
	sampler := usage.New(sup, usage.Config{Traffic: netw.traffic(), Logger: log})
	go sampler.Run(ctx)
	if o.sandboxMetrics {
		mx.WatchUsage(sampler, o.sandboxMetricsMax)
	}
	go sup.Activity().Watch(ctx, idle.WatchConfig{
		Candidates: sup.SleepCandidates, CPU: sup.SleepCPU, Sleep: sup.Sleep,
		Persist: sup.RecordActivity, Load: sup.LastActivity, Logger: log,
	})
	return sampler
}

// readToken reads the API token from a file; an empty path means no token.
func readToken(path string, log *slog.Logger) (string, error) {
	if path == "" {
		return "", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading the token file: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Mode().Perm()&0o077 != 0 {
		log.Warn("the token file is readable by other users; chmod 600 it", "path", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("reading the token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if len(token) < 16 {
		return "", fmt.Errorf("the token in %s is shorter than 16 characters; use a long random one, e.g. `head -c 32 /dev/urandom | base64`", path)
	}
	return token, nil
}

func newLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok && platform.IsTerminal(f.Fd()) {
			format = "text"
		} else if systemd.Journal(w) {
			// Under systemd, stderr is the journal's stream: it stamps each line and reads
			// its level from a syslog prefix, so neither the time nor colours belong there.
			format = "journal"
		}
	}
	switch format {
	case "text":
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: lvl, TimeFormat: time.TimeOnly})), nil
	case "journal":
		return slog.New(systemd.NewJournalHandler(w, &slog.HandlerOptions{Level: lvl})), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want auto, text, journal or json", format)
	}
}

// spareOptions are the spares' count and profile: what a create that names nothing gets. The
// default count applies to the namespace runtime only: a spare microVM holds its guest's
// memory, so keeping them is the operator's choice.
func spareOptions(o *options, rt runtime.Runtime, log *slog.Logger) *supervisor.SpareOptions {
	n := o.spares
	if rt.Kind() != namespace.Kind && !o.sparesExplicit {
		n = 0
	}
	if n > 0 {
		log.Debug("keeping spares", "spares", n)
	}
	return &supervisor.SpareOptions{Count: n, Resources: store.Resources(namespace.DefaultResources), DiskMB: o.defaultDiskMB}
}

// defaultDisk is the disk of its own that sandboxes get by default: the operator's choice, or
// boundedDiskMB where the runtime can give one. A host without loop devices or mke2fs still
// serves, with a warning that sandboxes are unbounded, unless the operator asked for a disk.
func defaultDisk(rt runtime.Runtime, o *options, log *slog.Logger) (int, error) {
	if o.defaultDiskMB == 0 {
		log.Warn("sandboxes get no disk of their own unless they ask for one: a sandbox can fill the state root's file system", "root", o.root)
		return 0, nil
	}
	why := errors.New("the runtime gives sandboxes no disk of their own")
	if dl, ok := rt.(runtime.DiskLimiter); ok {
		why = dl.DiskSupport()
	}
	switch {
	case why == nil:
		return o.defaultDiskMB, nil
	case o.diskExplicit:
		return 0, fmt.Errorf("--default-disk-mb %d: this host cannot give sandboxes a disk of their own: %v", o.defaultDiskMB, why)
	}
	log.Warn("sandboxes get no disk of their own on this host, so a sandbox can fill the state root's file system", "root", o.root, "reason", why)
	return 0, nil
}
