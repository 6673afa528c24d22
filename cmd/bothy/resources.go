package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// The ls, inspect and rm commands of the resources differ only in their words, the SDK call
// they make and, for ls, the table's columns.

// withAPI runs f with the API's client and a context that an interrupt cancels: what every
// command that calls the API does first.
func (c *cli) withAPI(f func(ctx context.Context, api *bothy.Client) error) error {
	api, err := c.client()
	if err != nil {
		return err
	}
	ctx, cancel := c.context()
	defer cancel()
	return f(ctx, api)
}

// listing is what a resource's ls command needs to know: cmd carries its words (Use,
// Aliases, Short, Args, completion), fetch the SDK call, name what -o name prints of an item,
// header and row the table's columns (tab-separated).
type listing[T any] struct {
	cmd    *cobra.Command
	fetch  func(ctx context.Context, api *bothy.Client, args []string) ([]T, error)
	name   func(T) string
	header string
	row    func(T) string
}

// listCommand is a resource's ls: it fetches the list and prints it as -o says, a table, JSON
// (an empty list as []) or one name a line.
func listCommand[T any](c *cli, l listing[T]) *cobra.Command {
	var output string
	if len(l.cmd.Aliases) == 0 {
		l.cmd.Aliases = []string{"list"}
	}
	l.cmd.RunE = runE(func(cmd *cobra.Command, args []string) error {
		return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
			list, err := l.fetch(ctx, api, args)
			if err != nil {
				return err
			}
			if done, err := printListShort(c, output, list, l.name); done {
				return err
			}
			tw := c.table()
			fmt.Fprintln(tw, l.header)
			for _, x := range list {
				fmt.Fprintln(tw, l.row(x))
			}
			return tw.Flush()
		})
	})
	outputFlag(l.cmd, &output, "table", "json", "name")
	return l.cmd
}

// inspectCommand prints, as JSON, what get answers for the one name (or id) given.
func inspectCommand[T any](c *cli, use, short string, get func(*bothy.Client, context.Context, string) (T, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				v, err := get(api, ctx, args[0])
				if err != nil {
					return err
				}
				return c.printJSON(v)
			})
		}),
	}
}

// removeCommand deletes each name (or id) given with del, in order, printing each deleted
// one; it stops at the first refusal.
func removeCommand(c *cli, use, short string, del func(*bothy.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Aliases: []string{"delete"},
		Short:   short,
		Args:    minArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				for _, name := range args {
					if err := del(api, ctx, name); err != nil {
						return err
					}
					fmt.Fprintln(c.stdout, name)
				}
				return nil
			})
		}),
	}
}
