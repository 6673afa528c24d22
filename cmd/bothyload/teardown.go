package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// teardownOptions are the command line of `bothyload teardown`.
type teardownOptions struct {
	target
	prefix                     string
	sandboxes, clients, diskMB int
	timeout                    time.Duration
}

// stopDeleteGoal is issue 17's stop+delete rate, per second.
const stopDeleteGoal = 100

// runTeardown is `bothyload teardown`: --sandboxes sandboxes are created and started (by
// --clients clients), then every one is stopped (forced) and deleted by --clients clients,
// and the rate of that second phase is reported: how fast a host full of running sandboxes
// empties. Both phases print their rate and the latencies of their steps.
func runTeardown(args []string, stdout, stderr io.Writer) (int, error) {
	o, err := parseTeardownFlags(args, stderr)
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
	a := newAPI(o.url, token, o.clients)
	ids := make([]string, o.sandboxes)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", o.prefix, i)
	}
	// Whatever a failure leaves goes at the end (a forced delete of each, errors ignored).
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		for _, id := range ids {
			_ = a.call(cctx, "DELETE", "/v1/sandboxes/"+id+"?force=true", nil, nil, 204)
		}
	}()
	up := newRecorder()
	upTime, err := fanOut(ctx, o, ids, func(ctx context.Context, id string) error {
		body := map[string]any{"id": id, "start": true}
		if o.diskMB >= 0 {
			body["resources"] = map[string]any{"disk_mb": o.diskMB}
		}
		return timed(up, "create+start", func() error { return a.create(ctx, body) })
	})
	if err != nil {
		return 1, fmt.Errorf("starting the sandboxes: %w", err)
	}
	down := newRecorder()
	downTime, err := fanOut(ctx, o, ids, func(ctx context.Context, id string) error {
		t0 := time.Now()
		if err := timed(down, "stop", func() error { return a.stop(ctx, id, true) }); err != nil {
			return err
		}
		if err := timed(down, "delete", func() error { return a.remove(ctx, id) }); err != nil {
			return err
		}
		down.ok("stop+delete", time.Since(t0), 0)
		return nil
	})
	if err != nil {
		return 1, fmt.Errorf("stopping and deleting the sandboxes: %w", err)
	}
	rate := float64(o.sandboxes) / downTime.Seconds()
	verdict := "missed"
	if rate >= stopDeleteGoal {
		verdict = "met"
	}
	fmt.Fprintf(stdout, "bothyload teardown %s: %d sandboxes, %d clients\n\n", o.url, o.sandboxes, o.clients)
	fmt.Fprintf(stdout, "started %d in %.2fs = %.1f/s\n", o.sandboxes, upTime.Seconds(), float64(o.sandboxes)/upTime.Seconds())
	printTable(stdout, up.report(upTime))
	fmt.Fprintf(stdout, "\nstopped and deleted %d in %.2fs = %.1f/s (goal ≥ %d/s: %s)\n", o.sandboxes, downTime.Seconds(), rate, stopDeleteGoal, verdict)
	printTable(stdout, down.report(downTime))
	return 0, nil
}

// timed runs f and records its latency under op in rec, or its error.
func timed(rec *recorder, op string, f func() error) error {
	t0 := time.Now()
	if err := f(); err != nil {
		rec.fail(op, errKey(err))
		return err
	}
	rec.ok(op, time.Since(t0), 0)
	return nil
}

// fanOut runs f for every id from o.clients goroutines, each request under o.timeout, and
// returns how long all took; the first error stops the rest.
func fanOut(ctx context.Context, o teardownOptions, ids []string, f func(context.Context, string) error) (time.Duration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for range o.clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ids) || ctx.Err() != nil {
					return
				}
				rctx, rcancel := context.WithTimeout(ctx, o.timeout)
				err := f(rctx, ids[i])
				rcancel()
				if err != nil {
					cancel(fmt.Errorf("%s: %w", ids[i], err))
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0), context.Cause(ctx)
}

func parseTeardownFlags(args []string, stderr io.Writer) (teardownOptions, error) {
	var o teardownOptions
	fs := flag.NewFlagSet("bothyload teardown", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(fs, "allow a URL that is not a loopback address")
	fs.IntVar(&o.sandboxes, "sandboxes", 100, "sandboxes to start, then stop and delete")
	fs.IntVar(&o.clients, "clients", 8, "concurrent clients of each phase")
	fs.IntVar(&o.diskMB, "disk-mb", -1, "the disk of each sandbox in MiB (0: none; -1: the server's default)")
	fs.StringVar(&o.prefix, "prefix", "", "prefix of the sandbox ids (default: teardown-<random>)")
	fs.DurationVar(&o.timeout, "request-timeout", 60*time.Second, "deadline of one request")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.sandboxes < 1 || o.sandboxes > 100000 || o.clients < 1 || o.clients > 1024 || o.timeout <= 0 || o.diskMB < -1 {
		return o, errors.New("--sandboxes must be 1 to 100000, --clients 1 to 1024, --request-timeout positive, --disk-mb -1 or more")
	}
	if o.prefix == "" {
		o.prefix = fmt.Sprintf("teardown-%06x", rand.Uint32()&0xffffff)
	}
	return o, nil
}
