package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
)

// Run runs the agent until it is asked to shut down over the control session (it then
// returns nil, and the caller, PID 1, exits, which ends the sandbox) or receives TERM or INT
// (it then ends every process of the sandbox, with Config.ShutdownGrace between TERM and
// KILL, and returns nil). Every other signal that can be caught, but those the Go runtime
// needs, is caught and dropped: see ignoreSignals.
func Run(cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	defer ignoreSignals(log)()
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	return RunContext(ctx, cfg)
}

// RunContext is Run with ctx standing for the TERM and INT signals: when ctx ends, the agent
// shuts the sandbox down and returns. It installs no handlers for TERM and INT itself.
func RunContext(ctx context.Context, cfg Config) error {
	a, err := newAgent(cfg)
	if err != nil {
		return err
	}
	defer a.reaper.close()
	ln := cfg.Listener
	if ln == nil {
		if ln, err = listen(cfg.ListenPath); err != nil {
			return err
		}
	}
	var handler control.Handler = a
	if cfg.ConfigureNetwork != nil {
		handler = netAgent{agent: a, configure: cfg.ConfigureNetwork}
	}
	a.log.Info("agent listening", "socket", ln.Addr().String(), "hostname", cfg.Hostname,
		"pid", os.Getpid(), "reap_all", a.reaper.all, "unprivileged", a.unprivileged)

	var (
		wg       sync.WaitGroup
		connMu   sync.Mutex
		conns    = map[net.Conn]struct{}{}
		shutdown = make(chan struct{})
		once     sync.Once
	)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			connMu.Lock()
			conns[conn] = struct{}{}
			connMu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := control.Serve(conn, a.capability(), handler)
				connMu.Lock()
				delete(conns, conn)
				connMu.Unlock()
				switch {
				case errors.Is(err, control.ErrShutdown):
					once.Do(func() { close(shutdown) })
				case errors.Is(err, control.ErrUnauthorized):
					a.log.Warn("agent refused a connection that did not authenticate")
				case err != nil:
					a.log.Debug("control connection ended", "err", err)
				}
			}()
		}
	}()

	select {
	case <-shutdown:
		a.log.Info("agent shutting down on request")
	case <-ctx.Done():
		a.log.Info("agent shutting down on signal", "grace", a.grace)
		a.terminate(context.Background(), a.grace)
	}
	ln.Close()
	connMu.Lock()
	for c := range conns {
		c.Close()
	}
	connMu.Unlock()
	wg.Wait()
	return nil
}

func listen(path string) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("agent: no listen path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("agent: creating the socket directory: %w", err)
	}
	// A socket left by an earlier agent of this sandbox would make Listen fail; anything
	// that is not a socket is not ours to remove.
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		os.Remove(path)
	}
	// Bind under a temporary name and rename into place once listening: the socket path
	// appears only when connecting to it works, so a launcher can wait for the path and dial
	// once, without a window where the path exists but refuses connections.
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+"."+randomHex()+".tmp")
	ln, err := net.Listen("unix", tmp) //nolint:noctx // the agent's lifetime listener
	if err != nil {
		return nil, fmt.Errorf("agent: listening: %w", err)
	}
	// Closing the listener must not unlink a socket a later agent may own; we remove stale
	// ones at start instead.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("agent: restricting the socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("agent: publishing the socket: %w", err)
	}
	return ln, nil
}

// agent implements control.Handler: the operating-system side of every operation.
type agent struct {
	cfg          Config
	log          *slog.Logger
	users        map[string]UserSpec
	unprivileged bool
	pid1         bool
	grace        time.Duration
	reaper       *reaper
	stopping     atomic.Bool

	mu        sync.Mutex
	workloads map[int]struct{} // pids (= pgids) of running workloads

	tracked trackedTable // the tracked processes (procs_linux.go)

	// oomScoreFailed logs the first workload whose OOM score could not be raised.
	oomScoreFailed sync.Once
}

var _ control.Handler = (*agent)(nil)

// capability is the capability a new connection must present.
func (a *agent) capability() []byte {
	if a.cfg.CapabilityFunc != nil {
		return a.cfg.CapabilityFunc()
	}
	return a.cfg.Capability
}

func newAgent(cfg Config) (*agent, error) {
	if len(cfg.Capability) == 0 && (cfg.CapabilityFunc == nil || len(cfg.CapabilityFunc()) == 0) {
		return nil, errors.New("agent: no capability: refusing to serve a socket anyone could drive")
	}
	a := &agent{
		cfg:          cfg,
		log:          cfg.Logger,
		unprivileged: cfg.Unprivileged || os.Geteuid() != 0,
		pid1:         os.Getpid() == 1,
		grace:        cfg.ShutdownGrace,
		workloads:    map[int]struct{}{},
		users: map[string]UserSpec{
			control.User: {UID: defaultUID, GID: defaultUID, Home: defaultHome},
			control.Root: {UID: 0, GID: 0, Home: defaultRootDir},
		},
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.grace <= 0 {
		a.grace = defaultGrace
	}
	for name, u := range cfg.Users {
		if name != control.User && name != control.Root {
			return nil, fmt.Errorf("agent: unknown user %q in the configuration", name)
		}
		a.users[name] = u
	}
	for _, e := range cfg.DefaultEnv {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, fmt.Errorf("agent: default environment entry %q is not NAME=value", e)
		}
	}
	a.reaper = newReaper(cfg.ReapAll || a.pid1)
	return a, nil
}

func (a *agent) Version() string { return Version }

// user resolves a request's user name.
func (a *agent) user(name string) (string, UserSpec) {
	if name == "" {
		name = control.User
	}
	return name, a.users[name]
}

// netAgent is the agent of a sandbox whose NIC the agent configures (Config.ConfigureNetwork):
// it serves control's network operation too.
type netAgent struct {
	*agent
	configure func(ctx context.Context, address netip.Prefix, gateway netip.Addr) error
}

// ConfigureNetwork implements control.NetworkConfigurer.
func (n netAgent) ConfigureNetwork(ctx context.Context, address netip.Prefix, gateway netip.Addr) error {
	if !address.IsValid() {
		n.log.Info("taking the network down")
	} else {
		n.log.Info("configuring the network", "address", address, "gateway", gateway)
	}
	return n.configure(ctx, address, gateway)
}
