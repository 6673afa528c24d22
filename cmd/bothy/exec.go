package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/bothy/bothy/sdk/go/bothy"
)

// execFlags are exec's and shell's options.
type execFlags struct {
	interactive, tty, buffered bool
	env                        []string
	cwd, user, umask           string
	timeout                    time.Duration
}

func (f *execFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVarP(&f.env, "env", "e", nil, "an environment variable KEY=VALUE (repeatable)")
	fl.StringVarP(&f.cwd, "workdir", "w", "", "the working directory (absolute)")
	fl.StringVarP(&f.user, "user", "u", "", "user (the default) or root")
	fl.StringVar(&f.umask, "umask", "", "the command's umask in octal, such as 0077 (default the server's, 0022)")
	fl.DurationVar(&f.timeout, "timeout", 0, "kill the command after this long (default the server's, an hour)")
}

func (c *cli) execCommand() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec [-it] ID -- COMMAND [ARG...]",
		Short: "Run a command in a running sandbox, streaming its input and output",
		Long: `Run a command in a running sandbox over the exec websocket: its output is streamed as it
comes, -i sends stdin to it, -t gives it a terminal (raw mode and window size forwarded when
stdin is one). bothy exits with the command's exit code. --buffered runs it with one
request instead (stdin, with -i, is sent whole; output is capped by the server).

Put the command after "--" when it has flags of its own.`,
		Example: `  bothy exec demo -- uname -a
  bothy exec -it demo -- /bin/sh
  bothy exec demo -u root -e DEBUG=1 -w /tmp -- sh -c 'id; pwd'
  echo hi | bothy exec -i demo -- cat`,
		Args:              minArgs(2),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return c.runCommand(args[0], args[1:], f)
		}),
	}
	f.add(cmd)
	cmd.Flags().BoolVarP(&f.interactive, "interactive", "i", false, "send stdin to the command")
	cmd.Flags().BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal")
	cmd.Flags().BoolVar(&f.buffered, "buffered", false, "run it in one request and print its output when it ends")
	return cmd
}

func (c *cli) shellCommand() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "shell ID [-- COMMAND [ARG...]]",
		Short: "An interactive terminal in a running sandbox (default /bin/sh)",
		Long: `An interactive session in a running sandbox: exec -i, with a terminal when stdin is one
(raw mode, window size changes forwarded). The command defaults to /bin/sh.`,
		Args:              minArgs(1),
		ValidArgsFunction: c.completeSandboxes,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			command := args[1:]
			if len(command) == 0 {
				command = []string{"/bin/sh"}
			}
			f.interactive = true
			f.tty = c.stdinTerminal() >= 0
			return c.runCommand(args[0], command, f)
		}),
	}
	f.add(cmd)
	return cmd
}

// stdinTerminal is stdin's file descriptor when it is a terminal, else -1.
func (c *cli) stdinTerminal() int {
	if f, ok := c.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return int(f.Fd())
	}
	return -1
}

func (c *cli) runCommand(id string, command []string, f execFlags) error {
	for _, e := range f.env {
		if _, _, ok := cutEnv(e); !ok {
			return usagef("-e %q is not KEY=VALUE", e)
		}
	}
	api, err := c.client()
	if err != nil {
		return err
	}
	o := &bothy.ExecOptions{Env: f.env, Cwd: f.cwd, User: f.user, Timeout: f.timeout, Umask: f.umask}
	if f.buffered {
		return c.runBuffered(api, id, command, o, f.interactive)
	}
	ctx, cancel := c.context()
	defer cancel()
	fd := c.stdinTerminal()
	if f.tty {
		o.TTY = true
		if fd >= 0 {
			if cols, rows, err := term.GetSize(fd); err == nil {
				o.Rows, o.Cols = rows, cols
			}
		}
	}
	s, err := api.ExecStream(ctx, id, command, o)
	if err != nil {
		return err
	}
	defer s.Close()
	if f.tty && fd >= 0 {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return err
		}
		// Restored before bothy exits with the command's code, since run returns first.
		defer func() { _ = term.Restore(fd, old) }()
		defer forwardResizes(s, fd)()
	}
	if f.interactive {
		go pumpStdin(s, c.stdin)
	} else if err := s.CloseStdin(); err != nil {
		return err
	}
	exit, err := s.Copy(c.stdout, c.stderr)
	if err != nil {
		return fmt.Errorf("the session ended before the command: %w", err)
	}
	if exit.TimedOut {
		fmt.Fprintln(c.stderr, c.paint(yellow, "bothy: the command timed out and was killed"))
	}
	return exitOf(exit.Code, exit.Signal)
}

func cutEnv(e string) (string, string, bool) {
	for i := 0; i < len(e); i++ {
		if e[i] == '=' {
			return e[:i], e[i+1:], i > 0
		}
	}
	return "", "", false
}

func (c *cli) runBuffered(api *bothy.Client, id string, command []string, o *bothy.ExecOptions, interactive bool) error {
	if interactive {
		in, err := io.ReadAll(c.stdin)
		if err != nil {
			return err
		}
		o.Stdin = string(in)
	}
	ctx, cancel := c.context()
	defer cancel()
	res, err := api.Exec(ctx, id, command, o)
	if err != nil {
		return err
	}
	_, _ = io.WriteString(c.stdout, res.Stdout)
	_, _ = io.WriteString(c.stderr, res.Stderr)
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintln(c.stderr, c.paint(yellow, "bothy: the output was cut at the server's cap; run without --buffered to stream all of it"))
	}
	if res.TimedOut {
		fmt.Fprintln(c.stderr, c.paint(yellow, "bothy: the command timed out and was killed"))
	}
	return exitOf(res.ExitCode, res.Signal)
}

// exitOf is the exit code bothy passes on: the command's, or 128+N when signal N ended
// it, as a shell reports it.
func exitOf(code int, sig *string) error {
	if code == 0 && sig != nil && *sig != "" {
		if n := unix.SignalNum(*sig); n != 0 {
			code = 128 + int(n)
		} else {
			code = 128
		}
	}
	if code == 0 {
		return nil
	}
	return exitCode(code)
}

// forwardResizes sends the terminal's size whenever it changes, until the returned stop is
// called.
func forwardResizes(s *bothy.Stream, fd int) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-winch:
				if cols, rows, err := term.GetSize(fd); err == nil {
					_ = s.Resize(rows, cols)
				}
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(winch); close(done) }
}

// pumpStdin copies stdin to the command and says eof when it ends; it returns when either
// side is done.
func pumpStdin(s *bothy.Stream, in io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			// End of input or a read error: either way the command gets no more stdin.
			_ = s.CloseStdin()
			return
		}
	}
}
