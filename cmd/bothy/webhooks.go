package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

func (c *cli) webhookCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "webhook",
		Aliases: []string{"webhooks"},
		Short:   "Register, list, inspect and delete webhooks",
		Args:    cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("webhook needs a subcommand: create, ls, inspect or rm")
		}),
	}
	cmd.AddCommand(c.webhookCreateCommand(), c.webhookListCommand(), c.webhookInspectCommand(), c.webhookRemoveCommand())
	return cmd
}

func (c *cli) webhookCreateCommand() *cobra.Command {
	var o bothy.WebhookOptions
	var secretFile string
	cmd := &cobra.Command{
		Use:   "create URL --event TYPE... --secret-file FILE",
		Short: "Register a URL that is sent the events of the given types, signed, and print its id",
		Long: `Register a webhook: every event of the given types is POSTed to URL, signed with the secret
(docs/webhooks.md says how a receiver verifies it). The secret is read from --secret-file
(- for stdin) or $BOTHY_WEBHOOK_SECRET, never from the command line, where other users of the
host could see it.`,
		Example: `  head -c 32 /dev/urandom | base64 > hook.secret
  bothy webhook create https://hooks.example.com/bothy --event sandbox.created --event sandbox.exited --secret-file hook.secret`,
		Args: exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			secret, err := c.webhookSecret(secretFile)
			if err != nil {
				return err
			}
			o.URL, o.Secret = args[0], secret
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				w, err := api.CreateWebhook(ctx, o)
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, w.ID)
				return nil
			})
		}),
	}
	cmd.Flags().StringArrayVar(&o.Events, "event", nil, "an event type to deliver (sandbox.created, sandbox.exited, ...); repeatable")
	cmd.Flags().StringVar(&secretFile, "secret-file", "", "a file holding the signing secret (- for stdin); default $BOTHY_WEBHOOK_SECRET")
	return cmd
}

// webhookSecret reads the secret from path, or the environment.
func (c *cli) webhookSecret(path string) (string, error) {
	var b []byte
	var err error
	switch path {
	case "":
		if s := os.Getenv("BOTHY_WEBHOOK_SECRET"); s != "" {
			return s, nil
		}
		return "", usagef("give the signing secret with --secret-file FILE or $BOTHY_WEBHOOK_SECRET")
	case "-":
		b, err = io.ReadAll(io.LimitReader(c.stdin, 4096))
	default:
		b, err = os.ReadFile(path) //nolint:gosec // the user's own file, named by the user
	}
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", errors.New("the secret file is empty")
	}
	return s, nil
}

func (c *cli) webhookListCommand() *cobra.Command {
	return listCommand(c, listing[bothy.Webhook]{
		cmd: &cobra.Command{
			Use:   "ls",
			Short: "List webhooks and how their deliveries go",
			Args:  cobra.NoArgs,
		},
		fetch: func(ctx context.Context, api *bothy.Client, _ []string) ([]bothy.Webhook, error) {
			return api.Webhooks(ctx)
		},
		name:   func(w bothy.Webhook) string { return w.ID },
		header: "ID\tURL\tEVENTS\tPENDING\tDELIVERED\tLAST STATUS\tLAST ERROR",
		row: func(w bothy.Webhook) string {
			status := "-"
			if w.Delivery.LastStatus != nil {
				status = fmt.Sprint(*w.Delivery.LastStatus)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%s\t%s", w.ID, w.URL, strings.Join(w.Events, ","),
				w.Delivery.Pending, w.Delivery.Delivered, status, orDashPtr(w.Delivery.LastError))
		},
	})
}

func (c *cli) webhookInspectCommand() *cobra.Command {
	return inspectCommand(c, "inspect ID", "Print a webhook and its delivery state as JSON", (*bothy.Client).GetWebhook)
}

func (c *cli) webhookRemoveCommand() *cobra.Command {
	return removeCommand(c, "rm ID...", "Delete webhooks; their pending events are not delivered", (*bothy.Client).DeleteWebhook)
}
