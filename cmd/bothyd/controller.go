package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/cluster/controller"
	"github.com/bothy/bothy/cluster/node"
)

// controllerCommand is `bothyd controller`: the cluster's leader-elected controller
// (docs/cluster.md), which marks the sandboxes of a node whose lease lapsed node-lost and
// places the Sandbox objects users make on a node. Run two or more; one leads.
func controllerCommand(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bothyd controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	hostname, _ := os.Hostname()
	kubeconfig := fs.String("cluster-kubeconfig", os.Getenv("KUBECONFIG"), "the kubeconfig file that reaches the API server (env KUBECONFIG); default: the pod's service account (in-cluster)")
	ns := fs.String("cluster-namespace", envOr("BOTHY_CLUSTER_NAMESPACE", config.Namespace), "the namespace of the Sandbox objects and the leases (env BOTHY_CLUSTER_NAMESPACE)")
	identity := fs.String("identity", envOr("POD_NAME", fmt.Sprintf("%s-%d", hostname, os.Getpid())), "this replica's name in the election (env POD_NAME); default: host name and process id")
	lease := fs.Duration("lease-duration", node.DefaultLeaseDuration, "the election lease's duration; renew deadline 2/3 of it, retries every 2/15")
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
		fmt.Fprintln(stderr, "bothyd controller:", err)
		return 2
	}
	klog.SetSlogLogger(log.With("component", "client-go"))
	crlog.SetLogger(logr.FromSlogHandler(log.With("component", "controller-runtime").Handler()))
	cfg, err := (&clusterOptions{kubeconfig: *kubeconfig}).restConfig()
	if err != nil {
		log.Error("bothyd controller", "err", err)
		return 2
	}
	c, err := node.NewClient(cfg)
	if err != nil {
		log.Error("bothyd controller", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("bothyd controller running", "identity", *identity, "namespace", *ns)
	err = controller.Run(ctx, controller.Config{
		Rest: cfg, Client: c, Namespace: *ns, Identity: *identity,
		LeaseDuration: *lease, RenewDeadline: *lease * 2 / 3, RetryPeriod: *lease * 2 / 15, Logger: log,
	})
	if err != nil {
		log.Error("bothyd controller stopped", "err", err)
		return 1
	}
	return 0
}
