package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bothy/bothy/cluster/api/v1alpha1"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/cluster/router"
	"github.com/bothy/bothy/runtime/namespace"
	"github.com/bothy/bothy/server"
	"github.com/bothy/bothy/web"
)

// routerCommand is `bothyd router`: the cluster's stateless front (docs/cluster.md), which
// serves the API for every node of the cluster. It runs no sandbox and opens no state root.
func routerCommand(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bothyd router", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o routerOptions
	fs.StringVar(&o.listen, "listen", envOr("BOTHY_LISTEN", "127.0.0.1:7780"), "address to serve on (env BOTHY_LISTEN)")
	fs.StringVar(&o.tokenFile, "token-file", os.Getenv("BOTHY_TOKEN_FILE"), "file holding the token clients present to the router (env BOTHY_TOKEN_FILE)")
	fs.StringVar(&o.nodeTokenFile, "node-token-file", os.Getenv("BOTHY_NODE_TOKEN_FILE"), "file holding the token the router presents to the nodes (env BOTHY_NODE_TOKEN_FILE); default: the clients' token")
	fs.StringVar(&o.operatorTokenFile, "operator-token-file", os.Getenv("BOTHY_OPERATOR_TOKEN_FILE"), "file holding the operator's token (env BOTHY_OPERATOR_TOKEN_FILE): when given, cordoning and draining a node need it, and it is taken wherever the clients' token is; default: the clients' token may cordon and drain")
	fs.BoolVar(&o.insecureNoAuth, "insecure-no-auth", false, "serve without a token, on loopback only")
	fs.StringVar(&o.kubeconfig, "cluster-kubeconfig", os.Getenv("KUBECONFIG"), "the kubeconfig file that reaches the API server (env KUBECONFIG); default: the pod's service account (in-cluster)")
	fs.StringVar(&o.namespace, "cluster-namespace", envOr("BOTHY_CLUSTER_NAMESPACE", config.Namespace), "the namespace of the Sandbox objects and the nodes' leases (env BOTHY_CLUSTER_NAMESPACE)")
	logFormat := fs.String("log-format", envOr("BOTHY_LOG_FORMAT", "auto"), "log format: auto, text, journal or json (env BOTHY_LOG_FORMAT)")
	logLevel := fs.String("log-level", envOr("BOTHY_LOG_LEVEL", "info"), "log level (env BOTHY_LOG_LEVEL)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	log, err := newLogger(*logFormat, *logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd router:", err)
		return 2
	}
	klog.SetSlogLogger(log.With("component", "client-go"))
	if err := serveRouter(o, log); err != nil {
		log.Error("bothyd router stopped", "err", err)
		return 1
	}
	return 0
}

// routerOptions are `bothyd router`'s flags.
type routerOptions struct {
	listen                                      string
	tokenFile, nodeTokenFile, operatorTokenFile string
	insecureNoAuth                              bool
	kubeconfig, namespace                       string
}

// cachedClient is a client whose reads come from informers — watches of the BothyNodes, the
// Leases and the Sandbox objects kept in memory — so that a call through the router reads
// nothing from the API server: with a read per call the router added about 140 ms to a
// create on a loaded 2-core machine (BenchmarkClusterRouter). The informers start with the
// first read of each kind, which waits for their first listing.
func cachedClient(ctx context.Context, cfg *rest.Config, ns string) (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	informers, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		return nil, err
	}
	go func() { _ = informers.Start(ctx) }()
	return client.New(cfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: informers}})
}

func serveRouter(o routerOptions, log *slog.Logger) error {
	token, err := readToken(o.tokenFile, log)
	if err != nil {
		return err
	}
	if token == "" && !o.insecureNoAuth {
		return errors.New("give --token-file (or --insecure-no-auth on loopback): the router serves every node's sandboxes")
	}
	nodeToken := token
	if o.nodeTokenFile != "" {
		if nodeToken, err = readToken(o.nodeTokenFile, log); err != nil {
			return err
		}
	}
	var operatorToken string
	if o.operatorTokenFile != "" {
		if operatorToken, err = readToken(o.operatorTokenFile, log); err != nil {
			return err
		}
		if token == "" || operatorToken == "" || operatorToken == token {
			return errors.New("--operator-token-file needs a --token-file, and a token of its own: the operator's must differ from the clients'")
		}
	}
	cfg, err := (&clusterOptions{kubeconfig: o.kubeconfig}).restConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := cachedClient(ctx, cfg, o.namespace)
	if err != nil {
		return err
	}
	h, err := router.New(router.Config{
		Client: c, Namespace: o.namespace, Token: token, NodeToken: nodeToken, OperatorToken: operatorToken,
		DefaultMemoryMB: int64(namespace.DefaultResources.MemoryMB), DefaultVCPUs: int64(namespace.DefaultResources.VCPUs),
		Logger: log, Dashboard: web.Handler(),
	})
	if err != nil {
		return err
	}
	go h.Run(ctx)                          // follows the nodes' event streams for /v1/events
	ln, err := net.Listen("tcp", o.listen) //nolint:noctx // start-up: no request to end it
	if err != nil {
		return err
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && token == "" && !tcp.IP.IsLoopback() {
		ln.Close()
		return fmt.Errorf("--insecure-no-auth serves on loopback only, not %s", ln.Addr())
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	// The same line as a node's, so that what waits for a bothyd to serve waits for a router too.
	log.Info("bothyd serving", "mode", "router", "addr", ln.Addr().String(), "namespace", o.namespace, "operator_token", operatorToken != "")
	// The router is what clients reach: it bounds each client's connections as a node does
	// (a node bounds each client's streams, named by the router: internal/forwarded).
	if err := srv.Serve(server.LimitListener(ln, server.DefaultMaxConns, server.DefaultMaxConnsPerClient)); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
