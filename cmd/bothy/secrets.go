package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// maxSecretInput bounds what a secret command reads from stdin or a file: the server takes
// at most 8 KiB, and a larger input (a file named by mistake) is refused without reading it
// all into memory.
const maxSecretInput = 64 << 10

// secretValueFlags are where a create or a rotation reads the value from. There is no flag
// that takes the value itself: a command line is readable by every user of the host
// (/proc/PID/cmdline, ps) and stays in shell histories.
type secretValueFlags struct {
	stdin bool
	file  string
}

func (f *secretValueFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.stdin, "value-stdin", false, "read the value from stdin (without echo when stdin is a terminal)")
	cmd.Flags().StringVar(&f.file, "from-file", "", "read the value from the file F")
}

// read returns the value from stdin or the file, without one trailing line break (echo and
// editors add one, and a value in a header cannot hold it).
func (f *secretValueFlags) read(c *cli) (string, error) {
	var raw []byte
	switch {
	case f.stdin && f.file != "":
		return "", usagef("give the value with either --value-stdin or --from-file, not both")
	case f.stdin:
		if fd := c.stdinTerminal(); fd >= 0 {
			fmt.Fprint(c.stderr, "Value: ")
			b, err := term.ReadPassword(fd)
			fmt.Fprintln(c.stderr)
			if err != nil {
				return "", fmt.Errorf("read the value from the terminal: %w", err)
			}
			raw = b
			break
		}
		b, err := io.ReadAll(io.LimitReader(c.stdin, maxSecretInput+1))
		if err != nil {
			return "", fmt.Errorf("read the value from stdin: %w", err)
		}
		raw = b
	case f.file != "":
		fh, err := os.Open(f.file)
		if err != nil {
			return "", fmt.Errorf("read the value: %w", err)
		}
		defer fh.Close()
		b, err := io.ReadAll(io.LimitReader(fh, maxSecretInput+1))
		if err != nil {
			return "", fmt.Errorf("read the value from %s: %w", f.file, err)
		}
		raw = b
	default:
		return "", usagef("give the value with --value-stdin (piped, or typed without echo) or --from-file F; it is never taken on the command line, which every user of the host can read")
	}
	if len(raw) > maxSecretInput {
		return "", usagef("the value is longer than %d KiB; a secret's value is at most 8 KiB", maxSecretInput>>10)
	}
	raw = bytes.TrimSuffix(raw, []byte("\n"))
	raw = bytes.TrimSuffix(raw, []byte("\r"))
	if len(raw) == 0 {
		return "", usagef("the value is empty; pipe it to --value-stdin or name a file holding it with --from-file")
	}
	return string(raw), nil
}

func (c *cli) secretCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "secret",
		Aliases: []string{"secrets"},
		Short:   "Create, list, inspect, rotate and delete secrets, which sandboxes use without holding them",
		Long: `A secret is stored once in bothyd and never shown again. A sandbox's network policy binds
it to hosts (network.secrets in POST /v1/sandboxes or PUT /v1/sandboxes/ID/network); the sandbox sees only a placeholder
(BOTHY_SECRET_<NAME>), and bothyd's egress proxy puts the value in its place on requests to
those hosts (docs/secrets.md). Values are read from stdin or a file, never from the command
line.`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return usagef("secret needs a subcommand: create, ls, inspect, rotate or rm")
		}),
	}
	cmd.AddCommand(c.secretCreateCommand(), c.secretListCommand(), c.secretInspectCommand(), c.secretRotateCommand(), c.secretRemoveCommand())
	return cmd
}

func (c *cli) secretCreateCommand() *cobra.Command {
	var f secretValueFlags
	cmd := &cobra.Command{
		Use:   "create NAME (--value-stdin | --from-file F)",
		Short: "Store a secret and print its name",
		Example: `  printf %s "$API_KEY" | bothy secret create API_KEY --value-stdin
  bothy secret create API_KEY --from-file ./api-key.txt
  bothy secret create API_KEY --value-stdin        # typed, without echo`,
		Args: exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			value, err := f.read(c)
			if err != nil {
				return err
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				s, err := api.CreateSecret(ctx, args[0], value)
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, s.Name)
				return nil
			})
		}),
	}
	f.add(cmd)
	return cmd
}

func (c *cli) secretRotateCommand() *cobra.Command {
	var f secretValueFlags
	cmd := &cobra.Command{
		Use:     "rotate NAME (--value-stdin | --from-file F)",
		Short:   "Replace a secret's value; sandboxes keep their placeholders and send the new value from their next request",
		Example: `  printf %s "$NEW_KEY" | bothy secret rotate API_KEY --value-stdin`,
		Args:    exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			value, err := f.read(c)
			if err != nil {
				return err
			}
			return c.withAPI(func(ctx context.Context, api *bothy.Client) error {
				s, err := api.RotateSecret(ctx, args[0], value)
				if err != nil {
					return err
				}
				fmt.Fprintln(c.stdout, s.Name)
				return nil
			})
		}),
	}
	f.add(cmd)
	return cmd
}

func (c *cli) secretListCommand() *cobra.Command {
	return listCommand(c, listing[bothy.Secret]{
		cmd: &cobra.Command{
			Use:   "ls",
			Short: "List secrets (never their values) and the sandboxes that bind them",
			Args:  cobra.NoArgs,
		},
		fetch: func(ctx context.Context, api *bothy.Client, _ []string) ([]bothy.Secret, error) {
			return api.Secrets(ctx)
		},
		name:   func(s bothy.Secret) string { return s.Name },
		header: "NAME\tBOUND BY\tCREATED\tROTATED",
		row: func(s bothy.Secret) string {
			var uses []string
			for _, u := range s.Bindings {
				uses = append(uses, u.Sandbox+"→"+strings.Join(u.Hosts, ","))
			}
			rotated := "-"
			if s.RotatedAt != nil {
				rotated = s.RotatedAt.Format("2006-01-02 15:04")
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s", s.Name, orDash(strings.Join(uses, " ")), s.CreatedAt.Format("2006-01-02 15:04"), rotated)
		},
	})
}

func (c *cli) secretInspectCommand() *cobra.Command {
	return inspectCommand(c, "inspect NAME", "Print a secret as JSON: its name, times and bindings, never its value", (*bothy.Client).GetSecret)
}

func (c *cli) secretRemoveCommand() *cobra.Command {
	return removeCommand(c, "rm NAME...", "Delete secrets; one that a sandbox's policy binds is refused", (*bothy.Client).DeleteSecret)
}
