package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// The checkpoint, rollback and fork commands (docs/checkpoints.md).

func (c *cli) checkpointCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "checkpoint",
		Aliases: []string{"checkpoints"},
		Short:   "Take, list and delete named checkpoints of a sandbox's files",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("checkpoint needs a subcommand: create, ls or rm")
		}),
	}
	var timeout time.Duration
	create := &cobra.Command{
		Use:               "create ID NAME",
		Short:             "Take the checkpoint NAME of the sandbox ID's files (a running sandbox is frozen for it)",
		Example:           "  bothy checkpoint create demo before-upgrade",
		Args:              exactArgs(2),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				cp, err := api.CreateCheckpoint(ctx, args[0], args[1], timeout)
				if err != nil {
					return err
				}
				freeze := ""
				if cp.FreezeMs != nil {
					freeze = fmt.Sprintf(", frozen %d ms", *cp.FreezeMs)
				}
				fmt.Fprintf(c.stdout, "%s (%s, %d bytes%s)\n", cp.Name, cp.Mode, cp.SizeBytes, freeze)
				return nil
			})
		}),
	}
	create.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait for the sandbox (default: the server's, 30s)")
	ls := listCommand(c, listing[bothy.Checkpoint]{
		cmd: &cobra.Command{
			Use:               "ls ID",
			Short:             "List a sandbox's checkpoints",
			Args:              exactArgs(1),
			ValidArgsFunction: c.completeSandboxes,
		},
		fetch: func(ctx context.Context, api *bothy.Client, args []string) ([]bothy.Checkpoint, error) {
			return api.Checkpoints(ctx, args[0])
		},
		name:   func(cp bothy.Checkpoint) string { return cp.Name },
		header: "NAME\tMODE\tSIZE\tLAYERS\tCREATED",
		row: func(cp bothy.Checkpoint) string {
			return fmt.Sprintf("%s\t%s\t%d\t%d\t%s", cp.Name, cp.Mode, cp.SizeBytes, cp.Layers, ago(cp.CreatedAt))
		},
	})
	rm := &cobra.Command{
		Use:               "rm ID NAME...",
		Aliases:           []string{"delete"},
		Short:             "Delete checkpoints of a sandbox",
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				for _, name := range args[1:] {
					if err := api.DeleteCheckpoint(ctx, args[0], name); err != nil {
						return err
					}
					fmt.Fprintln(c.stdout, name)
				}
				return nil
			})
		}),
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}

func (c *cli) rollbackCommand() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "rollback ID CHECKPOINT",
		Short: "Roll a sandbox's files back to a checkpoint, in place (a running sandbox is restarted)",
		Example: `  bothy checkpoint create demo good
  bothy exec demo -- rm -rf /home/user
  bothy rollback demo good`,
		Args:              exactArgs(2),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				sb, err := api.Rollback(ctx, args[0], args[1], timeout)
				if err != nil {
					return err
				}
				fmt.Fprintf(c.stdout, "%s %s\n", sb.ID, sb.State)
				return nil
			})
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait for the sandbox to stop and start (default: the server's, 30s)")
	return cmd
}

func (c *cli) forkCommand() *cobra.Command {
	var count int
	var ids []string
	var timeout time.Duration
	var output string
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Fork a sandbox into new ones that run on from its files (prints each fork's id)",
		Example: `  bothy fork demo --count 3
  bothy fork demo --id try-a --id try-b`,
		Args:              exactArgs(1),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if count == 0 && len(ids) == 0 {
				count = 1
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				res, err := api.Fork(ctx, args[0], count, ids, timeout)
				if err != nil {
					return err
				}
				if output == "json" {
					return c.printJSON(res)
				}
				var failed []string
				for _, it := range res.Items {
					if it.Error != nil {
						fmt.Fprintf(c.stderr, "fork %s: %s\n", it.ID, it.Error.Detail)
						failed = append(failed, it.ID)
						continue
					}
					fmt.Fprintln(c.stdout, it.ID)
				}
				if len(failed) > 0 {
					return fmt.Errorf("%d of %d forks failed: %s", len(failed), len(res.Items), strings.Join(failed, ", "))
				}
				return nil
			})
		}),
	}
	cmd.Flags().IntVar(&count, "count", 0, "how many forks to make, 1 to 16 (default 1)")
	cmd.Flags().StringArrayVar(&ids, "id", nil, "an id for a fork, one fork for each; repeat for more (default: ids the server chooses)")
	// The API takes a count or ids, not both (they could disagree).
	cmd.MarkFlagsMutuallyExclusive("count", "id")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait for the forks to start (default: the server's, 30s)")
	outputFlag(cmd, &output, "name", "json")
	return cmd
}
