package main

import (
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
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
			t, err := api.CreateTemplate(ctx, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(c.stdout, t.Name)
			return nil
		}),
	}
	var output string
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List templates",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
			list, err := api.Templates(ctx)
			if err != nil {
				return err
			}
			if done, err := printListShort(c, output, list, func(t bothy.Template) string { return t.Name }); done {
				return err
			}
			tw := c.table()
			fmt.Fprintln(tw, "NAME\tGENERATIONS\tLATEST\tCREATED")
			for _, t := range list {
				latest := "-"
				if t.Latest != nil {
					latest = *t.Latest
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", t.Name, t.Generations, latest, ago(t.CreatedAt))
			}
			return tw.Flush()
		}),
	}
	outputFlag(ls, &output, "table", "json", "name")
	var drain bool
	rm := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Delete a template and retire its generations (--drain: once their clones are gone)",
		Args:    exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
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
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
			g, err := api.Capture(ctx, args[1], args[0], timeout)
			if err != nil {
				return err
			}
			if output == "json" {
				return c.printJSON(g)
			}
			fmt.Fprintln(c.stdout, g.ID)
			return nil
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
	var output string
	ls := &cobra.Command{
		Use:     "ls TEMPLATE",
		Aliases: []string{"list"},
		Short:   "List a template's generations, newest first",
		Args:    exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
			list, err := api.Generations(ctx, args[0])
			if err != nil {
				return err
			}
			if done, err := printListShort(c, output, list, func(g bothy.Generation) string { return g.ID }); done {
				return err
			}
			tw := c.table()
			fmt.Fprintln(tw, "ID\tSTATE\tELIGIBILITY\tLEASES\tSIZE\tCAPTURED")
			for _, g := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", g.ID, g.State, g.Eligibility, g.Leases, size(g.SizeBytes), ago(g.CapturedAt))
			}
			return tw.Flush()
		}),
	}
	outputFlag(ls, &output, "table", "json", "name")
	tombstone := &cobra.Command{
		Use:   "tombstone TEMPLATE GENERATION",
		Short: "Quarantine a generation: no new clones, existing ones keep working",
		Args:  exactArgs(2),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
			g, err := api.Tombstone(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintln(c.stdout, g.ID)
			return nil
		}),
	}
	var drain bool
	retire := &cobra.Command{
		Use:     "retire TEMPLATE GENERATION",
		Aliases: []string{"rm"},
		Short:   "Delete a generation no clone leases (--drain: once its clones are gone)",
		Args:    exactArgs(2),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
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
	var output string
	ls := &cobra.Command{
		Use:     "ls TEMPLATE GENERATION",
		Aliases: []string{"list"},
		Short:   "List the clones that lease a generation",
		Args:    exactArgs(2),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
			list, err := api.Leases(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			if done, err := printListShort(c, output, list, func(l bothy.Lease) string { return l.ID }); done {
				return err
			}
			tw := c.table()
			fmt.Fprintln(tw, "ID\tSANDBOX\tACQUIRED")
			for _, l := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", l.ID, l.Sandbox, ago(l.AcquiredAt))
			}
			return tw.Flush()
		}),
	}
	outputFlag(ls, &output, "table", "json", "name")
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
