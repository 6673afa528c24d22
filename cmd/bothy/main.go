// Command bothy is the command-line client of bothyd, built on the Go SDK
// ([github.com/bothy/bothy/sdk/go/bothy]) and cobra, with the habits of docker and
// kubectl: flags before or after the arguments, `--help` on every command, shell completion,
// `-o json` where there is something to list, and the remote command's exit code from exec
// and shell.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// Exit codes other than a remote command's own.
const (
	exitOK      = 0
	exitFailure = 1 // the API refused, or bothyd could not be reached
	exitUsage   = 2 // the command line is wrong
)

const exitCodesHelp = `Exit codes:
  0    success
  1    the API answered with an error, or bothyd could not be reached
  2    the command line is wrong (unknown command or flag, missing arguments)
  exec and shell exit with the remote command's own code (128+N when signal N ended it).`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is bothy with its arguments and streams, returning its exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	root := c.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if cmd == nil {
		cmd = root
	}
	return c.report(cmd, err)
}

// usageError is a command line that does not make sense; it exits 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// runtimeError is a failure of a command that was well formed; it exits 1. Every command's
// RunE is wrapped (see [runE]) so that whatever it returns is one, and the errors that cobra
// returns itself (unknown commands and flags, wrong arguments) are not: those are usage.
type runtimeError struct{ err error }

func (r runtimeError) Error() string { return r.err.Error() }
func (r runtimeError) Unwrap() error { return r.err }

// exitCode passes a remote command's exit code through as bothy's own; its message, if
// any, was printed already.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// runE wraps a command's body: its errors are runtime errors, unless it says otherwise.
func runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := f(cmd, args)
		var u usageError
		var e exitCode
		if err == nil || errors.As(err, &u) || errors.As(err, &e) {
			return err
		}
		return runtimeError{err}
	}
}

// report prints err once and returns the exit code it stands for.
func (c *cli) report(cmd *cobra.Command, err error) int {
	if err == nil {
		return exitOK
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code)
	}
	var rt runtimeError
	if !errors.As(err, &rt) {
		fmt.Fprintf(c.stderr, "%s %v\nRun '%s --help' for usage.\n", c.paint(red, "error:"), err, cmd.CommandPath())
		return exitUsage
	}
	var apiErr *bothy.APIError
	switch {
	case errors.As(err, &apiErr) && bothy.IsUnsupported(err):
		fmt.Fprintf(c.stderr, "%s this bothyd does not have that operation: %v; it may be older than this bothy.\n", c.paint(red, "error:"), apiErr)
	case errors.As(err, &apiErr):
		fmt.Fprintf(c.stderr, "%s %v\n", c.paint(red, "error:"), apiErr)
	case errors.Is(err, bothy.ErrUnreachable):
		fmt.Fprintf(c.stderr, "%s %v\nhint: is bothyd running? start it with: go run ./cmd/bothyd\n", c.paint(red, "error:"), err)
	default:
		fmt.Fprintf(c.stderr, "%s %v\n", c.paint(red, "error:"), err)
	}
	return exitFailure
}

// exactArgs is cobra.ExactArgs with the command's usage line in its message.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("%q needs %d argument(s), got %d: usage: %s", cmd.CommandPath(), n, len(args), cmd.UseLine())
		}
		return nil
	}
}

// minArgs is cobra.MinimumNArgs with the command's usage line in its message.
func minArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return fmt.Errorf("%q needs at least %d argument(s), got %d: usage: %s", cmd.CommandPath(), n, len(args), cmd.UseLine())
		}
		return nil
	}
}
