package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// nodeCommand is `bothy node`: a cluster's nodes through its router's nodes API
// (docs/cluster.md). A single bothyd answers them not-a-cluster.
func (c *cli) nodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "node",
		Aliases: []string{"nodes"},
		Short:   "List, inspect, cordon, uncordon and drain a cluster's nodes (through its router)",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("node needs a subcommand: ls, inspect, cordon, uncordon or drain")
		}),
	}
	cmd.AddCommand(c.nodeListCommand(), c.nodeInspectCommand(), c.nodeCordonCommand(true), c.nodeCordonCommand(false), c.nodeDrainCommand())
	return cmd
}

func (c *cli) nodeListCommand() *cobra.Command {
	return listCommand(c, listing[bothy.Node]{
		cmd: &cobra.Command{
			Use:   "ls",
			Short: "List the cluster's nodes: health, cordon and drain, sandboxes and what is free",
			Args:  cobra.NoArgs,
		},
		fetch: func(ctx context.Context, api *bothy.Client, _ []string) ([]bothy.Node, error) {
			return api.Nodes(ctx)
		},
		name:   func(n bothy.Node) string { return n.Name },
		header: "NAME\tHEALTH\tPLACEMENT\tSANDBOXES\tFREE-SLOTS\tFREE-MEMORY\tFREE-CPU\tVERSION",
		row: func(n bothy.Node) string {
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%d/%d\t%dMiB\t%.1f\t%s", n.Name, nodeHealth(n), nodePlacement(n), n.Sandboxes,
				n.Free.Sandboxes, n.Capacity.Sandboxes, n.Free.MemoryMb, float64(n.Free.MilliCPU)/1000, orDashPtr(n.Version))
		},
	})
}

// nodeHealth is the node's verdict, or lost when its lease has lapsed.
func nodeHealth(n bothy.Node) string {
	switch {
	case !n.Live:
		return "lost"
	case n.Health == "":
		return "unpublished"
	}
	return n.Health
}

// nodePlacement says whether placement may put a new sandbox on the node.
func nodePlacement(n bothy.Node) string {
	switch {
	case n.Draining && n.Drain != nil && n.Drain.Drained:
		return "drained"
	case n.Draining && n.Drain != nil:
		return fmt.Sprintf("draining(%d)", n.Drain.Remaining)
	case n.Draining:
		return "draining"
	case n.Cordoned:
		return "cordoned"
	}
	return "schedulable"
}

func (c *cli) nodeInspectCommand() *cobra.Command {
	return inspectCommand(c, "inspect NAME", "Print a node as JSON", (*bothy.Client).GetNode)
}

// nodeCordonCommand is cordon (on) or uncordon.
func (c *cli) nodeCordonCommand(on bool) *cobra.Command {
	use, short := "cordon NAME...", "Cordon nodes: placement puts no new sandbox there; their own keep running"
	if !on {
		use, short = "uncordon NAME...", "Uncordon nodes: placement may put sandboxes there again"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  minArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				for _, name := range args {
					if _, err := api.PatchNode(ctx, name, bothy.NodeChange{Cordoned: &on}); err != nil {
						return err
					}
					fmt.Fprintln(c.stdout, name)
				}
				return nil
			})
		}),
	}
}

func (c *cli) nodeDrainCommand() *cobra.Command {
	var deadline time.Duration
	var cancelDrain bool
	cmd := &cobra.Command{
		Use:   "drain NAME [--deadline 2h | --cancel]",
		Short: "Drain a node: it takes no new sandbox, and at the deadline deletes those it still holds",
		Long: `Drain a node (docs/cluster.md, Drain): placement skips it and the node refuses creates;
its sandboxes run until their lifetimes end or their owners delete them, and --deadline after
now the node deletes, forced, those it still holds. Without --deadline it waits for them.
Sandboxes are ended, not moved: they are stateful and node-local. --cancel calls the drain off.`,
		Example: `  bothy node drain node-b --deadline 2h
  bothy node ls            # PLACEMENT shows draining(N), then drained
  bothy node drain node-b --cancel`,
		Args: exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if deadline < 0 {
				return usagef("--deadline %v: want a duration after now (30m, 2h)", deadline)
			}
			if cancelDrain && deadline != 0 {
				return usagef("give either --deadline or --cancel, not both")
			}
			draining := !cancelDrain
			change := bothy.NodeChange{Draining: &draining}
			switch {
			case cancelDrain:
				change.ClearDrainDeadline = true
			case deadline > 0:
				at := time.Now().Add(deadline).Truncate(time.Second)
				change.DrainDeadline = &at
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				n, err := api.PatchNode(ctx, args[0], change)
				if err != nil {
					return err
				}
				switch {
				case cancelDrain:
					fmt.Fprintf(c.stdout, "%s: drain called off\n", n.Name)
				case n.DrainDeadline != nil:
					fmt.Fprintf(c.stdout, "%s: draining; what is left is deleted at %s\n", n.Name, n.DrainDeadline.Local().Format(time.RFC3339))
				default:
					fmt.Fprintf(c.stdout, "%s: draining; no deadline, the node waits for its sandboxes to end\n", n.Name)
				}
				return nil
			})
		}),
	}
	cmd.Flags().DurationVar(&deadline, "deadline", 0, "delete what the node still holds this long after now (30m, 2h); none: wait")
	cmd.Flags().BoolVar(&cancelDrain, "cancel", false, "call the drain off: the node takes creates again")
	return cmd
}
