package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// The inspect and rm commands of the resources named by one argument (volumes, secrets,
// webhooks) differ only in their words and in the SDK call they make.

// inspectCommand prints, as JSON, what get answers for the one name (or id) given.
func inspectCommand[T any](c *cli, use, short string, get func(*bothy.Client, context.Context, string) (T, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
			v, err := get(api, ctx, args[0])
			if err != nil {
				return err
			}
			return c.printJSON(v)
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
			api, err := c.client()
			if err != nil {
				return err
			}
			ctx, cancel := c.context()
			defer cancel()
			for _, name := range args {
				if err := del(api, ctx, name); err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, name)
			}
			return nil
		}),
	}
}
