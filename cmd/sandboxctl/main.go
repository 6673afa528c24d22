// Command sandboxctl is a small command-line client of sandboxd, built on the generated Go
// client: list, create, start, stop and delete sandboxes, run commands (buffered, or live
// over the exec websocket with a terminal), copy files in and out, and read logs.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/openapi/client"
)

const usage = `usage: sandboxctl [--url URL] [--token-file FILE | --root DIR] COMMAND [ARGS]

commands:
  ls [--state STATE] [--label K=V]...       list sandboxes
  create [--id ID] [--image NAME] [--start] [--label K=V]... [--env K=V]...
         [--vcpus N] [--memory-mb N] [--pids N] [--disk-mb N]
         [--timeout-s N] [--on-timeout stop|delete]
  get ID                                    show a sandbox
  start ID | stop [--force] ID | rm [-f] ID lifecycle (rm -f stops it by force first)
  pause ID | resume ID                      freeze and thaw every process of a sandbox
  timeout [--on-timeout stop|delete] ID SECONDS   set its lifetime anew from now (0 clears it)
  wait [--timeout-ms N] ID STATE            wait until it is in STATE (or "deleted")
  exec [--user U] [--cwd DIR] ID -- CMD...  run a command, print its output, exit with its code
  shell [--user U] ID [-- CMD...]           an interactive terminal (default: /bin/sh)
  put ID LOCAL REMOTE | fetch ID REMOTE LOCAL   copy a file in or out ("-" is stdin/stdout)
  logs [--tail N] ID                        the sandbox's log

The server is $SANDBOXD_URL (default http://127.0.0.1:7780); the token file $SANDBOXD_TOKEN_FILE,
or else the one sandboxd generated in its state root, $SANDBOXD_ROOT (default .sandboxd).
`

func main() {
	os.Exit(run(os.Args[1:]))
}

// cli holds what every command needs.
type cli struct {
	url   string
	token string
	api   *client.ClientWithResponses
}

func run(args []string) int {
	global := flag.NewFlagSet("sandboxctl", flag.ContinueOnError)
	global.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	url := global.String("url", envOr("SANDBOXD_URL", "http://127.0.0.1:7780"), "sandboxd's URL")
	tokenFile := global.String("token-file", os.Getenv("SANDBOXD_TOKEN_FILE"), "file holding the API token")
	root := global.String("root", envOr("SANDBOXD_ROOT", ".sandboxd"), "sandboxd's state root, where it keeps the token it generated")
	if err := global.Parse(args); err != nil {
		return 2
	}
	if global.NArg() == 0 {
		global.Usage()
		return 2
	}
	c := &cli{url: strings.TrimSuffix(*url, "/")}
	token, err := readToken(*tokenFile, *root)
	if err != nil {
		return fail(err)
	}
	c.token = token
	api, err := client.NewClientWithResponses(c.url, client.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		return nil
	}))
	if err != nil {
		return fail(err)
	}
	c.api = api
	cmd, rest := global.Arg(0), global.Args()[1:]
	commands := map[string]func([]string) error{
		"ls": c.list, "create": c.create, "get": c.get, "start": c.start, "stop": c.stop, "rm": c.remove,
		"exec": c.exec, "shell": c.shell, "put": c.put, "fetch": c.fetch, "logs": c.logs,
		"pause": c.pause, "resume": c.resume, "timeout": c.timeout, "wait": c.wait,
	}
	f, ok := commands[cmd]
	if !ok {
		fmt.Fprintf(os.Stderr, "sandboxctl: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if err := f(rest); err != nil {
		var exit exitCode
		if errors.As(err, &exit) {
			return int(exit)
		}
		return fail(err)
	}
	return 0
}

// exitCode passes a remote command's exit code through as sandboxctl's own.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// readToken is the API token: from file when one is given, else the one sandboxd generated in
// its state root. No token file there is no token (a server run with --insecure-no-auth); one
// that this user cannot read is an error that says whose it is.
func readToken(file, root string) (string, error) {
	explicit := file != ""
	if !explicit {
		file = filepath.Join(root, "token")
	}
	b, err := os.ReadFile(file)
	switch {
	case err == nil:
		return strings.TrimSpace(string(b)), nil
	case !explicit && errors.Is(err, fs.ErrNotExist):
		return "", nil
	case !explicit && errors.Is(err, fs.ErrPermission):
		return "", fmt.Errorf("cannot read sandboxd's token at %s: only the user that runs sandboxd can (use sudo if it runs as root), or give --token-file", file)
	default:
		return "", err
	}
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "sandboxctl:", err)
	return 1
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// problemError is a problem+json answer, shown as its detail and code.
type problemError struct {
	Status int
	Detail string
	Code   string
}

func (p *problemError) Error() string {
	return fmt.Sprintf("%s (%s, HTTP %d)", p.Detail, p.Code, p.Status)
}

// check turns a non-2xx response into a problemError.
func check(status int, body []byte) error {
	if status >= 200 && status < 300 {
		return nil
	}
	var p struct {
		Detail string `json:"detail"`
		Code   string `json:"code"`
	}
	if json.Unmarshal(body, &p) != nil || p.Code == "" {
		return fmt.Errorf("HTTP %d: %s", status, bytes.TrimSpace(body))
	}
	return &problemError{Status: status, Detail: p.Detail, Code: p.Code}
}

func printJSON(body []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, body, "", "  "); err != nil {
		_, err = os.Stdout.Write(body)
		return err
	}
	buf.WriteByte('\n')
	_, err := buf.WriteTo(os.Stdout)
	return err
}

func ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Minute)
}

// oneID parses a command's flags and its single sandbox id.
func oneID(fs *flag.FlagSet, args []string) (string, error) {
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	if fs.NArg() != 1 {
		return "", fmt.Errorf("%s needs one sandbox id", fs.Name())
	}
	return fs.Arg(0), nil
}

func (c *cli) list(args []string) error {
	fs := flag.NewFlagSet("ls", flag.ContinueOnError)
	state := fs.String("state", "", "only sandboxes in this state")
	var labels repeated
	fs.Var(&labels, "label", "only sandboxes with this label (K=V); repeatable")
	if err := fs.Parse(args); err != nil {
		return err
	}
	params := &client.ListSandboxesParams{}
	if *state != "" {
		s := client.SandboxState(*state)
		params.State = &s
	}
	if len(labels) > 0 {
		l := []string(labels)
		params.Label = &l
	}
	cx, cancel := ctx()
	defer cancel()
	var cursor *string
	fmt.Printf("%-24s %-12s %-10s %s\n", "ID", "STATE", "IMAGE", "CREATED")
	for {
		params.Cursor = cursor
		r, err := c.api.ListSandboxesWithResponse(cx, params)
		if err != nil {
			return err
		}
		if err := check(r.StatusCode(), r.Body); err != nil {
			return err
		}
		for _, sb := range r.JSON200.Items {
			fmt.Printf("%-24s %-12s %-10s %s\n", sb.ID, sb.State, sb.Image, sb.CreatedAt.Local().Format(time.DateTime))
		}
		if cursor = r.JSON200.NextCursor; cursor == nil {
			return nil
		}
	}
}

func (c *cli) create(args []string) error {
	fs := flag.NewFlagSet("create", flag.ContinueOnError)
	id := fs.String("id", "", "the sandbox id (default: generated)")
	image := fs.String("image", "", "the image (default: host)")
	start := fs.Bool("start", false, "start it too")
	vcpus := fs.Int("vcpus", 0, "CPUs")
	memory := fs.Int("memory-mb", 0, "memory limit in MiB")
	pids := fs.Int("pids", 0, "process limit")
	disk := fs.Int("disk-mb", 0, "a disk of its own, in MiB, bounding what it writes")
	lifetime := fs.Int("timeout-s", 0, "its lifetime in seconds (default: the server's)")
	onTimeout := fs.String("on-timeout", "", "what the end of its lifetime does: stop or delete")
	var labels, env repeated
	fs.Var(&labels, "label", "a label K=V; repeatable")
	fs.Var(&env, "env", "an environment variable K=V; repeatable")
	if err := fs.Parse(args); err != nil {
		return err
	}
	body := client.CreateSandboxJSONRequestBody{}
	if *id != "" {
		body.ID = id
	}
	if *image != "" {
		body.Image = image
	}
	if *start {
		body.Start = start
	}
	if *lifetime > 0 {
		body.TimeoutS = lifetime
	}
	if *onTimeout != "" {
		on := client.OnTimeout(*onTimeout)
		body.OnTimeout = &on
	}
	if len(env) > 0 {
		e := []string(env)
		body.Env = &e
	}
	if len(labels) > 0 {
		l := client.Labels{}
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			l[k] = v
		}
		body.Labels = &l
	}
	if *vcpus > 0 || *memory > 0 || *pids > 0 || *disk > 0 {
		res := &client.ResourcesRequest{}
		if *vcpus > 0 {
			res.Vcpus = vcpus
		}
		if *memory > 0 {
			res.MemoryMb = memory
		}
		if *pids > 0 {
			res.Pids = pids
		}
		if *disk > 0 {
			res.DiskMb = disk
		}
		body.Resources = res
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.CreateSandboxWithResponse(cx, nil, body)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	return printJSON(r.Body)
}

func (c *cli) get(args []string) error {
	id, err := oneID(flag.NewFlagSet("get", flag.ContinueOnError), args)
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.GetSandboxWithResponse(cx, id)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	return printJSON(r.Body)
}

func (c *cli) start(args []string) error {
	id, err := oneID(flag.NewFlagSet("start", flag.ContinueOnError), args)
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.StartSandboxWithResponse(cx, id, nil)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	return printJSON(r.Body)
}

func (c *cli) stop(args []string) error {
	fs := flag.NewFlagSet("stop", flag.ContinueOnError)
	force := fs.Bool("force", false, "kill instead of asking the sandbox to shut down")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.StopSandboxWithResponse(cx, id, &client.StopSandboxParams{Force: force})
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	return printJSON(r.Body)
}

func (c *cli) remove(args []string) error {
	fs := flag.NewFlagSet("rm", flag.ContinueOnError)
	force := fs.Bool("f", false, "stop it by force first if it runs (or is paused)")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.DeleteSandboxWithResponse(cx, id, &client.DeleteSandboxParams{Force: force})
	if err != nil {
		return err
	}
	return check(r.StatusCode(), r.Body)
}

func (c *cli) pause(args []string) error {
	id, err := oneID(flag.NewFlagSet("pause", flag.ContinueOnError), args)
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.PauseSandboxWithResponse(cx, id, nil)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	return printJSON(r.Body)
}

func (c *cli) resume(args []string) error {
	id, err := oneID(flag.NewFlagSet("resume", flag.ContinueOnError), args)
	if err != nil {
		return err
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.ResumeSandboxWithResponse(cx, id, nil)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	return printJSON(r.Body)
}

func (c *cli) timeout(args []string) error {
	fs := flag.NewFlagSet("timeout", flag.ContinueOnError)
	onTimeout := fs.String("on-timeout", "", "what the end of the lifetime does: stop (default) or delete")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("timeout needs a sandbox id and a number of seconds")
	}
	var seconds int
	if _, err := fmt.Sscan(fs.Arg(1), &seconds); err != nil {
		return fmt.Errorf("timeout: %q is not a number of seconds", fs.Arg(1))
	}
	body := client.SetSandboxTimeoutJSONRequestBody{TimeoutS: seconds}
	if *onTimeout != "" {
		on := client.OnTimeout(*onTimeout)
		body.OnTimeout = &on
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.SetSandboxTimeoutWithResponse(cx, fs.Arg(0), nil, body)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	return printJSON(r.Body)
}

func (c *cli) wait(args []string) error {
	fs := flag.NewFlagSet("wait", flag.ContinueOnError)
	timeoutMS := fs.Int("timeout-ms", 0, "how long to wait (default: the server's, 60 s)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("wait needs a sandbox id and a state")
	}
	params := &client.WaitSandboxParams{State: client.WaitSandboxParamsState(fs.Arg(1))}
	if *timeoutMS > 0 {
		params.TimeoutMs = timeoutMS
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.WaitSandboxWithResponse(cx, fs.Arg(0), params)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	if r.StatusCode() == http.StatusNoContent {
		return nil
	}
	return printJSON(r.Body)
}

func (c *cli) exec(args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	user := fs.String("user", "", "user or root")
	cwd := fs.String("cwd", "", "working directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(commandArgs(fs.Args()[min(1, fs.NArg()):])) == 0 {
		return errors.New("exec needs a sandbox id and a command: exec ID -- CMD ARGS")
	}
	body := client.ExecCommandJSONRequestBody{Command: commandArgs(fs.Args()[1:])}
	if *user != "" {
		body.User = user
	}
	if *cwd != "" {
		body.Cwd = cwd
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.ExecCommandWithResponse(cx, fs.Arg(0), body)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	res := r.JSON200
	os.Stdout.WriteString(res.Stdout)
	os.Stderr.WriteString(res.Stderr)
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintln(os.Stderr, "sandboxctl: output was cut; use shell for unbounded output")
	}
	if res.TimedOut {
		fmt.Fprintln(os.Stderr, "sandboxctl: the command timed out")
	}
	if res.ExitCode != 0 {
		return exitCode(res.ExitCode)
	}
	return nil
}

func (c *cli) put(args []string) error {
	if len(args) != 3 {
		return errors.New("put needs: ID LOCAL REMOTE")
	}
	var in io.Reader = os.Stdin
	if args[1] != "-" {
		f, err := os.Open(args[1])
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.WriteFileWithBodyWithResponse(cx, args[0], &client.WriteFileParams{Path: args[2]}, "application/octet-stream", in)
	if err != nil {
		return err
	}
	return check(r.StatusCode(), r.Body)
}

func (c *cli) fetch(args []string) error {
	if len(args) != 3 {
		return errors.New("fetch needs: ID REMOTE LOCAL")
	}
	cx, cancel := ctx()
	defer cancel()
	// The raw client streams the body instead of reading it whole.
	resp, err := c.api.ClientInterface.(*client.Client).ReadFile(cx, args[0], &client.ReadFileParams{Path: args[1]})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return check(resp.StatusCode, body)
	}
	var out io.Writer = os.Stdout
	if args[2] != "-" {
		f, err := os.Create(args[2])
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	_, err = io.Copy(out, resp.Body)
	return err
}

func (c *cli) logs(args []string) error {
	fs := flag.NewFlagSet("logs", flag.ContinueOnError)
	tail := fs.Int("tail", 0, "only the last N lines")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	params := &client.GetSandboxLogsParams{}
	if *tail > 0 {
		params.Tail = tail
	}
	cx, cancel := ctx()
	defer cancel()
	r, err := c.api.GetSandboxLogsWithResponse(cx, id, params)
	if err != nil {
		return err
	}
	if err := check(r.StatusCode(), r.Body); err != nil {
		return err
	}
	_, err = os.Stdout.Write(r.Body)
	return err
}

// commandArgs drops the "--" that separates a sandbox id from a command: the flag package
// stops at the id and leaves it.
func commandArgs(args []string) []string {
	if len(args) > 0 && args[0] == "--" {
		return args[1:]
	}
	return args
}
