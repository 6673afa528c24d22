package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/bothy/bothy/internal/systemd"
	"github.com/bothy/bothy/platform"
)

// holdLeaf is the leaf of bothy-sandboxes.service's cgroup that its holder process moves into,
// leaving the unit's cgroup free to hand controllers to the sandboxes' cgroups beside it.
const holdLeaf = "hold"

// holdControllers are the controllers sandboxes' cgroups are limited by.
var holdControllers = []string{"memory", "cpu", "pids"}

// holdPurpose says what `bothyd hold` is for, in each of its refusals and its start-up line.
const holdPurpose = "bothyd hold is the process of bothy-sandboxes.service, the systemd unit whose delegated cgroup holds every sandbox's cgroup " +
	"(bothyd.service's --cgroup-parent), so that a restart of bothyd.service kills no sandbox and stopping bothy-sandboxes.service stops them all"

// holdCommand is `bothyd hold`. On cgroup v2 it readies the unit's delegated cgroup for
// sandboxes' cgroups (platform.HoldCgroup), tells systemd it is ready, and waits for
// SIGTERM or SIGINT, which is how systemd stops the unit; it exits 0 then. On a host without
// a cgroup v2 hierarchy it has no cgroup to ready (sandboxes' cgroups are in the v1
// hierarchies, not below the unit), so it says so and only waits, so that the unit and the
// Wants= of bothyd.service are met. Run by hand, outside a Type=notify unit, it refuses:
// without systemd's delegation it would rearrange the caller's own cgroup.
func holdCommand(args []string, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "bothyd hold takes no arguments (got %q).\n%s.\n", strings.Join(args, " "), holdPurpose)
		return 2
	}
	if os.Getenv("NOTIFY_SOCKET") == "" {
		fmt.Fprintf(stderr, "bothyd hold: %s. It runs only as that unit's Type=notify process (NOTIFY_SOCKET is not set here); "+
			"without systemd, bothyd needs no holder and makes sandboxes' cgroups under --cgroup-parent itself.\n", holdPurpose)
		return 2
	}
	// Before readiness: a SIGTERM that comes as soon as systemd sees the unit ready must end
	// the wait, not the process by the signal's default action.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var status string
	cgroup, enabled, err := platform.HoldCgroup(holdLeaf, holdControllers)
	switch {
	case errors.Is(err, platform.ErrNoUnifiedCgroup):
		status = "cgroup v1: holding no cgroup, sandboxes' cgroups are in the v1 hierarchies"
		fmt.Fprintf(stderr, "bothyd hold: %s. This host has no cgroup v2 hierarchy (%v), so there is nothing to hold: waiting until stopped.\n", holdPurpose, err)
	case err != nil:
		fmt.Fprintf(stderr, "bothyd hold: %v\n", err)
		return 1
	default:
		status = "holding " + cgroup + " for sandboxes' cgroups"
		fmt.Fprintf(stderr, "bothyd hold: %s; moved into %s/%s; enabled for its children: %s (the rest were already)\n",
			status, cgroup, holdLeaf, orNone(enabled))
	}
	if _, err := systemd.Ready(status); err != nil {
		fmt.Fprintf(stderr, "bothyd hold: telling systemd it is ready: %v\n", err)
		return 1
	}
	<-ctx.Done()
	return 0
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}
