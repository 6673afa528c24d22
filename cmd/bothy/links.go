package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// The link commands: signed links that open one port of a sandbox without the API token
// (docs/network.md, "Links").

func (c *cli) linkCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "link",
		Aliases: []string{"links"},
		Short:   "Make, list and revoke links that open a sandbox's port without the API token",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("link needs a subcommand: create, ls or rm")
		}),
	}
	cmd.AddCommand(c.linkCreateCommand(), c.linkListCommand(), c.linkRemoveCommand())
	return cmd
}

// parsePort reads a port argument.
func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, usagef("the port %q is not a number from 1 to 65535", s)
	}
	return p, nil
}

func (c *cli) linkCreateCommand() *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:               "create ID PORT",
		Short:             "Make a link to port PORT of sandbox ID and print its URL (shown this once)",
		Example:           "  bothy link create demo 8000 --ttl 2h",
		Args:              exactArgs(2),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			port, err := parsePort(args[1])
			if err != nil {
				return err
			}
			if ttl != 0 && ttl < time.Second {
				return usagef("--ttl %v: a link lives at least 1s", ttl)
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				l, err := api.CreatePortLink(ctx, args[0], port, ttl)
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, strings.TrimSuffix(api.URL(), "/")+l.Path)
				fmt.Fprintf(c.stderr, "link %s, until %s; revoke it with: bothy link rm %s %d %s\n", l.ID, l.ExpiresAt.Local().Format(time.RFC3339), args[0], port, l.ID)
				return nil
			})
		}),
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the link works (default: the server's, 1h; at most 168h)")
	return cmd
}

func (c *cli) linkListCommand() *cobra.Command {
	return listCommand(c, listing[bothy.PortLinkInfo]{
		cmd: &cobra.Command{
			Use:               "ls ID [PORT]",
			Short:             "List the live links of a sandbox, or of one of its ports (never their tokens)",
			Args:              cobra.RangeArgs(1, 2),
			ValidArgsFunction: c.completeSandboxes,
		},
		fetch: func(ctx context.Context, api *bothy.Client, args []string) ([]bothy.PortLinkInfo, error) {
			port := 0
			if len(args) == 2 {
				p, err := parsePort(args[1])
				if err != nil {
					return nil, err
				}
				port = p
			}
			return api.PortLinks(ctx, args[0], port)
		},
		name:   func(l bothy.PortLinkInfo) string { return l.ID },
		header: "ID\tPORT\tCREATED\tEXPIRES",
		row: func(l bothy.PortLinkInfo) string {
			return fmt.Sprintf("%s\t%d\t%s\t%s", l.ID, l.Port, ago(l.CreatedAt), l.ExpiresAt.Local().Format(time.RFC3339))
		},
	})
}

func (c *cli) linkRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "rm ID PORT LINK...",
		Aliases:           []string{"revoke", "delete"},
		Short:             "Revoke links of a sandbox's port: their URLs stop working at once",
		Args:              minArgs(3),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			port, err := parsePort(args[1])
			if err != nil {
				return err
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				for _, id := range args[2:] {
					if err := api.RevokePortLink(ctx, args[0], port, id); err != nil {
						return err
					}
					fmt.Fprintln(c.stdout, id)
				}
				return nil
			})
		}),
	}
}
