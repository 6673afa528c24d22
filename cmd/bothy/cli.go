package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// cli holds the global flags and what every command shares.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	url, token, tokenFile, root string
	color                       string

	api *bothy.Client
	// progressDrawn says a progress bar was drawn in place on stderr and not yet ended.
	progressDrawn bool
}

const rootLong = `bothy talks to bothyd, which runs isolated Linux sandboxes on this host.

The server is --url, else $BOTHY_URL, else http://127.0.0.1:7780. The API token is
--token, else --token-file, else $BOTHY_TOKEN, else the file $BOTHY_TOKEN_FILE, else the
token bothyd generated in its state root (--root, $BOTHY_ROOT, default .bothy, else the
installed server's /var/lib/bothy), which only the user that runs bothyd can read: run
bothy as that user (sudo if it is root), or, with the packages, as a member of the group
bothy.

Flags may come before or after arguments; put a command's own arguments after "--"
(bothy exec ID -- ls -l /).

`

func (c *cli) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "bothy",
		Short:         "Run and manage bothyd's sandboxes",
		Long:          rootLong + exitCodesHelp,
		SilenceErrors: true,
		SilenceUsage:  true,
		// Without a subcommand, help: and exit 0, since asking for it is not an error.
		Run: func(cmd *cobra.Command, _ []string) { _ = cmd.Help() },
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{err}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&c.url, "url", "", "bothyd's URL (default $BOTHY_URL, else "+bothy.DefaultURL+")")
	pf.StringVar(&c.token, "token", "", "the API token (default $BOTHY_TOKEN)")
	pf.StringVar(&c.tokenFile, "token-file", "", "a file holding the API token (default $BOTHY_TOKEN_FILE)")
	pf.StringVar(&c.root, "root", "", "bothyd's state root, holding the token it generated (default $BOTHY_ROOT, else .bothy, else /var/lib/bothy)")
	pf.StringVar(&c.color, "color", "auto", "colour the output: auto (on a terminal, unless $NO_COLOR), always or never")

	root.AddGroup(&cobra.Group{ID: "sandboxes", Title: "Sandboxes:"},
		&cobra.Group{ID: "run", Title: "Commands and files:"},
		&cobra.Group{ID: "templates", Title: "Templates:"},
		&cobra.Group{ID: "images", Title: "Images:"},
		&cobra.Group{ID: "volumes", Title: "Volumes:"},
		&cobra.Group{ID: "secrets", Title: "Secrets:"},
		&cobra.Group{ID: "cluster", Title: "Cluster:"},
		&cobra.Group{ID: "system", Title: "Server:"})
	add := func(group string, cmds ...*cobra.Command) {
		for _, cmd := range cmds {
			cmd.GroupID = group
			root.AddCommand(cmd)
		}
	}
	add("sandboxes", c.createCommand(), c.listCommand(), c.inspectCommand(), c.startCommand(), c.stopCommand(),
		c.rmCommand(), c.pauseCommand(), c.resumeCommand(), c.waitCommand(), c.timeoutCommand(), c.logsCommand(), c.metricsCommand(),
		c.forkCommand(), c.checkpointCommand(), c.rollbackCommand())
	add("run", c.execCommand(), c.shellCommand(), c.cpCommand(), c.portForwardCommand(), c.linkCommand())
	add("templates", c.templateCommand(), c.captureCommand(), c.generationCommand(), c.leaseCommand())
	add("images", c.imageCommand(), c.pullCommand())
	add("volumes", c.volumeCommand())
	add("secrets", c.secretCommand())
	add("cluster", c.nodeCommand())
	add("system", c.infoCommand(), c.versionCommand(), c.eventsCommand(), c.webhookCommand())
	// The commands of bothy before cp took their place, kept for scripts that use them.
	root.AddCommand(c.putCommand(), c.fetchCommand())
	return root
}

// client is the SDK client of the configured server, made at first use so that help and
// completion need neither a server nor a token.
func (c *cli) client() (*bothy.Client, error) {
	if c.api != nil {
		return c.api, nil
	}
	url := firstOf(c.url, os.Getenv("BOTHY_URL"), bothy.DefaultURL)
	token, err := c.readToken()
	if err != nil {
		return nil, err
	}
	api, err := bothy.New(url, bothy.WithToken(token), bothy.WithUserAgent("bothy"))
	if err != nil {
		return nil, err
	}
	c.api = api
	return api, nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// readToken is the API token, from the first of --token, --token-file, $BOTHY_TOKEN,
// $BOTHY_TOKEN_FILE and the state root's token file. No token file in the state root is no
// token (a server run without auth); one this user cannot read is an error that says whose it
// is.
func (c *cli) readToken() (string, error) {
	if c.token != "" {
		return c.token, nil
	}
	if c.tokenFile != "" {
		return readTokenFile(c.tokenFile)
	}
	if t := os.Getenv("BOTHY_TOKEN"); t != "" {
		return t, nil
	}
	if f := os.Getenv("BOTHY_TOKEN_FILE"); f != "" {
		return readTokenFile(f)
	}
	root := firstOf(c.root, os.Getenv("BOTHY_ROOT"))
	if root != "" {
		return readRootToken(root)
	}
	// No root named: the one `go run ./cmd/bothyd` makes in the current directory, else the
	// installed server's.
	token, err := readRootToken(defaultRoot)
	if token != "" || err != nil {
		return token, err
	}
	return readRootToken(installedRoot)
}

// defaultRoot and installedRoot are bothyd's state roots: its default, relative to the
// directory it runs in, and the one its packages' unit gives it (packaging/bothyd.env).
// A variable, so that a test can point it elsewhere.
const defaultRoot = ".bothy"

var installedRoot = "/var/lib/bothy"

// readRootToken reads the token bothyd generated into root. No token file is no token (a
// server run without auth); one this user cannot read is an error that says whose it is.
func readRootToken(root string) (string, error) {
	file := filepath.Join(root, "token")
	b, err := os.ReadFile(file)
	switch {
	case err == nil:
		return strings.TrimSpace(string(b)), nil
	case errors.Is(err, fs.ErrNotExist):
		return "", nil
	case errors.Is(err, fs.ErrPermission):
		return "", fmt.Errorf("cannot read bothyd's token at %s: only the user that runs bothyd can (use sudo if it runs as root), "+
			"or a member of its --token-group (the packages' group bothy: `sudo usermod -aG bothy $USER`, then log in again), or give --token-file", file)
	default:
		return "", err
	}
}

func readTokenFile(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("the token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// context is the context of a command: cancelled by Ctrl-C or SIGTERM, so that a wait or a
// stream ends cleanly.
func (c *cli) context() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// ANSI colours, used only when [cli.colored] says so.
const (
	red    = "31"
	green  = "32"
	yellow = "33"
	gray   = "90"
)

// colored reports whether output to w is coloured: on a terminal unless $NO_COLOR, or as
// --color says.
func (c *cli) colored(w io.Writer) bool {
	switch c.color {
	case "always":
		return true
	case "never":
		return false
	}
	if os.Getenv("NO_COLOR") != "" {
		return false
	}
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (c *cli) paint(color, s string) string {
	if !c.colored(c.stderr) {
		return s
	}
	return "\x1b[" + color + "m" + s + "\x1b[0m"
}

func (c *cli) paintOut(color, s string) string {
	if !c.colored(c.stdout) {
		return s
	}
	return "\x1b[" + color + "m" + s + "\x1b[0m"
}

// printJSON writes v as indented JSON.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// outputFlag adds -o/--output with the formats given (the first is the default) and returns
// a check of the value given.
func outputFlag(cmd *cobra.Command, p *string, formats ...string) {
	cmd.Flags().StringVarP(p, "output", "o", formats[0], "output format: "+strings.Join(formats, ", "))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp))
	prev := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		ok := false
		for _, f := range formats {
			ok = ok || *p == f
		}
		if !ok {
			return usagef("-o %s is not one of %s", *p, strings.Join(formats, ", "))
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}

// completeSandboxes completes sandbox ids from the server, when it can be reached.
func (c *cli) completeSandboxes(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	api, err := c.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := c.context()
	defer cancel()
	list, err := api.List(ctx, bothy.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ids := make([]string, 0, len(list))
	for _, sb := range list {
		ids = append(ids, sb.ID)
	}
	return ids, cobra.ShellCompDirectiveNoFileComp
}

// each runs f for every id, printing the id of each that succeeded as docker does, and
// fails (after trying them all) if any failed.
func (c *cli) each(ids []string, f func(ctx context.Context, api *bothy.Client, id string) error) error {
	api, err := c.client()
	if err != nil {
		return err
	}
	ctx, cancel := c.context()
	defer cancel()
	var failed error
	for _, id := range ids {
		if err := f(ctx, api, id); err != nil {
			if len(ids) == 1 {
				return err
			}
			fmt.Fprintf(c.stderr, "%s %s: %v\n", c.paint(red, "error:"), id, err)
			failed = errors.New("not every sandbox could be handled; see above")
			continue
		}
		fmt.Fprintln(c.stdout, id)
	}
	return failed
}

// printListShort prints list as JSON (an empty list as [], never null) or as one name a line
// when output asks for either; done is false for the table outputs, which each command lays
// out itself (through [cli.table]).
func printListShort[T any](c *cli, output string, list []T, name func(T) string) (done bool, err error) {
	switch output {
	case "json":
		if list == nil {
			list = []T{}
		}
		return true, c.printJSON(list)
	case "name":
		for _, x := range list {
			fmt.Fprintln(c.stdout, name(x))
		}
		return true, nil
	}
	return false, nil
}

// table is the writer of every listing's table: columns three spaces apart.
func (c *cli) table() *tabwriter.Writer { return tabwriter.NewWriter(c.stdout, 0, 4, 3, ' ', 0) }
