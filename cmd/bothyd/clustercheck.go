package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/bothy/bothy/cluster/audit"
	"github.com/bothy/bothy/cluster/config"
	"github.com/bothy/bothy/cluster/node"
)

// clusterCheckCommand is `bothyd check --cluster [--cluster-kubeconfig F] [--cluster-namespace NS]
// [--node-token-file F] [--repair] [--json]`: the cluster-wide check (package cluster/audit),
// which compares the Sandbox objects with every live node's sandboxes. Exit status as `bothyd
// check`'s: 0 consistent (after repair, with --repair), 1 disagreements remain, 2 a usage
// error or a check that could not run.
func clusterCheckCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bothyd check --cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Bool("cluster", true, "check the cluster: the Sandbox objects against every live node's sandboxes")
	kubeconfig := fs.String("cluster-kubeconfig", os.Getenv("KUBECONFIG"), "the kubeconfig file that reaches the API server (env KUBECONFIG); default: the pod's service account (in-cluster)")
	ns := fs.String("cluster-namespace", envOr("BOTHY_CLUSTER_NAMESPACE", config.Namespace), "the namespace of the Sandbox objects and the nodes' leases (env BOTHY_CLUSTER_NAMESPACE)")
	nodeTokenFile := fs.String("node-token-file", os.Getenv("BOTHY_NODE_TOKEN_FILE"), "file holding the token the nodes' API takes (env BOTHY_NODE_TOKEN_FILE)")
	repair := fs.Bool("repair", false, "write each object as its node reads the sandbox, or remove an object whose node holds none; an id on two nodes is left to the operator")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: bothyd check --cluster [--cluster-kubeconfig FILE] [--cluster-namespace NS] [--node-token-file FILE] [--repair] [--json]")
		fmt.Fprintln(stderr, "Compares the cluster's Sandbox objects with every live node's sandboxes (docs/cluster.md). Exit status: 0 consistent, 1 disagreements found, 2 usage error or the check could not run.")
		fs.PrintDefaults()
	}
	if code, ok := parseCheckFlags(fs, args, stderr); !ok {
		return code
	}
	log, err := newLogger("text", "warn", stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	token, err := readToken(*nodeTokenFile, log)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	opts := &clusterOptions{kubeconfig: *kubeconfig}
	cfg, err := opts.restConfig()
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	c, err := node.NewClient(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := audit.Run(ctx, audit.Options{Client: c, Namespace: *ns, NodeToken: token, Repair: *repair})
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	return writeCheckReport(stdout, stderr, *asJSON, rep, rep.OK(), func(w io.Writer) { printClusterReport(w, rep, *repair) })
}

// printClusterReport writes the cluster checker's report as text.
func printClusterReport(w io.Writer, rep *audit.Report, repair bool) {
	fmt.Fprintf(w, "cluster: %d nodes (%d live), %d Sandbox objects, %d sandboxes on the live nodes, %d objects not verifiable (node lost, or not made yet)\n",
		rep.Nodes, rep.LiveNodes, rep.Objects, rep.Sandboxes, rep.Unverified)
	for _, p := range rep.Problems {
		fmt.Fprintln(w, "problem:", p)
	}
	switch {
	case len(rep.Problems) == 0:
		fmt.Fprintln(w, "ok: consistent")
	case rep.OK():
		fmt.Fprintf(w, "ok: %d problems found, all repaired\n", len(rep.Problems))
	case repair:
		fmt.Fprintf(w, "FAILED: %d problems found, %d not repaired\n", len(rep.Problems), rep.Remaining)
	default:
		fmt.Fprintf(w, "FAILED: %d problems found; --repair fixes those a node's reconcile would\n", len(rep.Problems))
	}
}
