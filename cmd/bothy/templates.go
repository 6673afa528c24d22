package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

func (c *cli) templateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "template",
		Aliases: []string{"templates"},
		Short:   "Create, list and delete templates",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("template needs a subcommand: create, ls or rm")
		}),
	}
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an empty template; capture generations into it with bothy capture",
		Args:  exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				t, err := api.CreateTemplate(ctx, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, t.Name)
				return nil
			})
		}),
	}
	ls := listCommand(c, listing[bothy.Template]{
		cmd: &cobra.Command{Use: "ls", Short: "List templates", Args: cobra.NoArgs},
		fetch: func(ctx context.Context, api *bothy.Client, _ []string) ([]bothy.Template, error) {
			return api.Templates(ctx)
		},
		name:   func(t bothy.Template) string { return t.Name },
		header: "NAME\tGENERATIONS\tLATEST\tCREATED",
		row: func(t bothy.Template) string {
			return fmt.Sprintf("%s\t%d\t%s\t%s", t.Name, t.Generations, orDashPtr(t.Latest), ago(t.CreatedAt))
		},
	})
	var drain bool
	rm := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Delete a template and retire its generations (--drain: once their clones are gone)",
		Args:    exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				pending, err := api.DeleteTemplate(ctx, args[0], drain)
				if err != nil {
					return err
				}
				if pending {
					fmt.Fprintf(c.stdout, "%s (tombstoned; it goes when its last clone is deleted)\n", args[0])
					return nil
				}
				fmt.Fprintln(c.stdout, args[0])
				return nil
			})
		}),
	}
	rm.Flags().BoolVar(&drain, "drain", false, "tombstone leased generations now and retire them with their last lease")
	cmd.AddCommand(create, ls, rm)
	return cmd
}

func (c *cli) captureCommand() *cobra.Command {
	var timeout time.Duration
	var output string
	cmd := &cobra.Command{
		Use:   "capture SANDBOX TEMPLATE",
		Short: "Capture a stopped sandbox as a new generation of a template, and print the generation",
		Example: `  bothy template create tools
  bothy capture builder tools
  bothy create --template tools --start`,
		Args:              exactArgs(2),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				g, err := api.Capture(ctx, args[1], args[0], timeout)
				if err != nil {
					return err
				}
				if output == "json" {
					return c.printJSON(g)
				}
				fmt.Fprintln(c.stdout, g.ID)
				return nil
			})
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "how long to wait for another transition of the sandbox")
	outputFlag(cmd, &output, "id", "json")
	return cmd
}

func (c *cli) generationCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "generation",
		Aliases: []string{"generations", "gen"},
		Short:   "List, tombstone and retire a template's generations",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("generation needs a subcommand: ls, tombstone or retire")
		}),
	}
	ls := listCommand(c, listing[bothy.Generation]{
		cmd: &cobra.Command{Use: "ls TEMPLATE", Short: "List a template's generations, newest first", Args: exactArgs(1)},
		fetch: func(ctx context.Context, api *bothy.Client, args []string) ([]bothy.Generation, error) {
			return api.Generations(ctx, args[0])
		},
		name:   func(g bothy.Generation) string { return g.ID },
		header: "ID\tSTATE\tELIGIBILITY\tLEASES\tSIZE\tCAPTURED\tFROM",
		row: func(g bothy.Generation) string {
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%s\t%s\t%s", g.ID, g.State, g.Eligibility, g.Leases, size(g.SizeBytes), ago(g.CapturedAt), lineage(g.Source))
		},
	})
	tombstone := &cobra.Command{
		Use:   "tombstone TEMPLATE GENERATION",
		Short: "Quarantine a generation: no new clones, existing ones keep working",
		Args:  exactArgs(2),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				g, err := api.Tombstone(ctx, args[0], args[1])
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, g.ID)
				return nil
			})
		}),
	}
	var drain bool
	retire := &cobra.Command{
		Use:     "retire TEMPLATE GENERATION",
		Aliases: []string{"rm"},
		Short:   "Delete a generation no clone leases (--drain: once its clones are gone)",
		Args:    exactArgs(2),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				pending, err := api.Retire(ctx, args[0], args[1], drain)
				if err != nil {
					return err
				}
				if pending {
					fmt.Fprintf(c.stdout, "%s (tombstoned; it goes when its last clone is deleted)\n", args[1])
					return nil
				}
				fmt.Fprintln(c.stdout, args[1])
				return nil
			})
		}),
	}
	retire.Flags().BoolVar(&drain, "drain", false, "tombstone it now and retire it with its last lease")
	cmd.AddCommand(ls, tombstone, retire)
	return cmd
}

func (c *cli) leaseCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "lease",
		Aliases: []string{"leases"},
		Short:   "List the clones that lease a generation",
		Args:    cobra.NoArgs,
		RunE:    runE(func(cmd *cobra.Command, _ []string) error { return usagef("lease needs a subcommand: ls") }),
	}
	ls := listCommand(c, listing[bothy.Lease]{
		cmd: &cobra.Command{Use: "ls TEMPLATE GENERATION", Short: "List the clones that lease a generation", Args: exactArgs(2)},
		fetch: func(ctx context.Context, api *bothy.Client, args []string) ([]bothy.Lease, error) {
			return api.Leases(ctx, args[0], args[1])
		},
		name:   func(l bothy.Lease) string { return l.ID },
		header: "ID\tSANDBOX\tACQUIRED",
		row:    func(l bothy.Lease) string { return fmt.Sprintf("%s\t%s\t%s", l.ID, l.Sandbox, ago(l.AcquiredAt)) },
	})
	cmd.AddCommand(ls)
	return cmd
}

// size is a byte count in binary units.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// lineage shows what a generation was captured from: its sandbox, and the sandbox's own
// parent generation when it was a clone ("clone1 (tools@g000001)"); "-" when not recorded.
func lineage(src *bothy.GenerationSource) string {
	if src == nil {
		return "-"
	}
	if src.Template == nil || src.Generation == nil {
		return src.Sandbox
	}
	return fmt.Sprintf("%s (%s@%s)", src.Sandbox, *src.Template, *src.Generation)
}
