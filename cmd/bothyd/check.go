package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/bothy/bothy/check"
	"github.com/bothy/bothy/store/template"
)

// checkCommand is `bothyd check [--root DIR] [--runtime-binary PATH] [--user-namespaces=false] [--repair] [--json]`:
// the consistency checker. It judges the state root with the runtime that the server makes
// from the same flags (newRuntime), with the cgroup parent that the state root records unless
// --cgroup-parent or BOTHY_CGROUP_PARENT gives one (settleCgroupParent). It exits 0 when the state root is consistent (after repair, with --repair), 1 when problems
// remain, and 2 on a usage error or when the check could not be made.
func checkCommand(args []string, stdout, stderr io.Writer) int {
	if slices.Contains(args, "--cluster") || slices.Contains(args, "-cluster") {
		return clusterCheckCommand(args, stdout, stderr)
	}
	fs := flag.NewFlagSet("bothyd check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", envOr("BOTHY_ROOT", ".bothy"), "state root to check (env BOTHY_ROOT)")
	// The runtime's flags are the server's, so that the checker's runtime is the server's.
	rtOpts, err := addRuntimeFlags(fs)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	repair := fs.Bool("repair", false, "fix what is safe to fix: end interrupted starts, clear stale records, kill unrecorded runtime processes, release leaked cgroups and mounts, finish template retirements")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	reg := options{cluster: &clusterOptions{}}
	fs.StringVar(&reg.templateRegistry, "template-registry", os.Getenv("BOTHY_TEMPLATE_REGISTRY"), "the server's template registry: with --repair, the tombstones and retirements made here that it does not hold yet are pushed to it (env BOTHY_TEMPLATE_REGISTRY)")
	fs.StringVar(&reg.registryAuth, "registry-auth", os.Getenv("BOTHY_REGISTRY_AUTH"), "the credentials of the template registry, as the server's (env BOTHY_REGISTRY_AUTH)")
	fs.Var(&reg.insecureRegistries, "insecure-registry", "a registry (host or host:port) spoken to over plain HTTP, as the server's; repeatable")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: bothyd check [--root DIR] [--runtime-binary PATH] [--user-namespaces=false] [--repair [--template-registry REPO [--registry-auth FILE] [--insecure-registry HOST]]] [--json]")
		fmt.Fprintln(stderr, "       bothyd check --cluster [--cluster-kubeconfig FILE] [--node-token-file FILE] [--repair] [--json] (bothyd check --cluster -h)")
		fmt.Fprintln(stderr, "Verifies a bothyd state root, offline or beside a running server. Exit status: 0 consistent, 1 problems found, 2 usage error or the check could not run.")
		fs.PrintDefaults()
	}
	if code, ok := parseCheckFlags(fs, args, stderr); !ok {
		return code
	}
	// The sandboxes' cgroups are where the server that made them says (cgroupparent.go), so
	// that a check typed at a shell, without the unit's environment, judges them right.
	rtOpts.noteCgroupParentSource(fs)
	if _, err := settleCgroupParent(rtOpts, *root); err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	// The report is the output; the log only carries warnings, coloured like the server's.
	log, err := newLogger("text", "warn", stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	rts, err := newRuntimes(*rtOpts, *root, log)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	opts := check.Options{Root: *root, Runtime: rts.def, Runtimes: rts.others, Repair: *repair, Logger: log}
	netw, err := checkerNetwork(*root, log)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	if netw != nil {
		defer netw.Close()
		opts.Network = netw
	}
	opts.Webhooks = checkWebhooks(*root)
	opts.Volumes = checkVolumes(*root)
	opts.Egress = checkEgress(*root)
	if reg.templateRegistry != "" {
		// Pushing tombstones puts and removes no mark, so the holder's name (the
		// server's cluster node name) does not matter here.
		opts.FlushTemplateOutbox = func(ctx context.Context, ts *template.Store) error {
			gr, err := openTemplateRegistry(&reg, ts)
			if err != nil {
				return err
			}
			// A record whose generation is still active may be a change the running
			// server is making now: the checker pushes what is due and drops nothing.
			notDue := func(tmpl, gen string) bool {
				due, err := ts.RemoteTombstoneDue(template.RemoteTombstone{Template: tmpl, Generation: gen})
				return err != nil || !due
			}
			pushed, err := gr.FlushTombstones(ctx, notDue)
			for _, p := range pushed {
				fmt.Fprintf(stderr, "pushed the tombstone of %s/%s to the template registry (retire %v)\n", p.Template, p.Generation, p.Retire)
			}
			return err
		}
	}
	rep, err := check.Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(stderr, "bothyd check:", err)
		return 2
	}
	return writeCheckReport(stdout, stderr, *asJSON, rep, rep.OK, func(w io.Writer) { printReport(w, rep) })
}

// writeCheckReport writes a checker's report, as JSON or as text, and returns the command's
// exit code: 0 when the report is ok, 1 when it is not, 2 when it could not be written.
func writeCheckReport(stdout, stderr io.Writer, asJSON bool, rep any, ok bool, text func(io.Writer)) int {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(stderr, "bothyd check:", err)
			return 2
		}
	} else {
		text(stdout)
	}
	if !ok {
		return 1
	}
	return 0
}

func printReport(w io.Writer, r *check.Report) {
	fmt.Fprintf(w, "state root %s: %d sandboxes (%d of them spares), %d running, %d runtime processes, %d deleted sandboxes' bins in the trash\n", r.Root, r.Sandboxes, r.Spares, r.Running, r.Processes, r.Trash)
	for _, p := range r.Problems {
		fmt.Fprintln(w, "problem:", p)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	switch {
	case len(r.Problems) == 0:
		fmt.Fprintln(w, "ok: consistent")
	case r.OK:
		fmt.Fprintf(w, "ok: %d problems found, all repaired\n", len(r.Problems))
	case r.Repair:
		fmt.Fprintf(w, "FAILED: %d problems found, %d not repaired\n", len(r.Problems), r.Remaining)
	default:
		fmt.Fprintf(w, "FAILED: %d problems found; --repair fixes those that are safe to fix\n", len(r.Problems))
	}
}

// parseCheckFlags parses the command line of `bothyd check` (either form) into fs. It
// returns ok false with the exit status when the command is to end there: 0 after -h, 2 for
// a bad flag or a stray argument (the usage then printed).
func parseCheckFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bothyd check: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2, false
	}
	return 0, true
}
