package tests

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ctlOK runs bothy and fails the test unless it exits 0.
func (d *daemon) ctlOK(stdin string, args ...string) string {
	d.t.Helper()
	out, stderr, code := d.ctl(stdin, args...)
	if code != 0 {
		d.t.Fatalf("bothy %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, stderr)
	}
	return out
}

// ctlJSON runs bothy, which must exit 0 with JSON on stdout, and decodes it into v.
func (d *daemon) ctlJSON(v any, args ...string) {
	d.t.Helper()
	out := d.ctlOK("", args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		d.t.Fatalf("bothy %s: stdout is not JSON (%v):\n%s", strings.Join(args, " "), err, out)
	}
}

// wantFail runs bothy, which must exit with code and say want on stderr, once.
func (d *daemon) wantFail(code int, want string, args ...string) string {
	d.t.Helper()
	_, stderr, got := d.ctl("", args...)
	if got != code || !strings.Contains(stderr, want) || strings.Count(stderr, "error:") != 1 {
		d.t.Fatalf("bothy %s: exit %d, want %d with %q once:\n%s", strings.Join(args, " "), got, code, want, stderr)
	}
	return stderr
}

type ctlSandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Labels    map[string]string `json:"labels"`
	Resources struct {
		Vcpus    int `json:"vcpus"`
		MemoryMb int `json:"memory_mb"`
		Pids     int `json:"pids"`
	} `json:"resources"`
	Template *struct {
		Template   string `json:"template"`
		Generation string `json:"generation"`
	} `json:"template"`
}

func (d *daemon) inspect(id string) ctlSandbox {
	d.t.Helper()
	var list []ctlSandbox
	d.ctlJSON(&list, "inspect", id)
	if len(list) != 1 || list[0].ID != id {
		d.t.Fatalf("inspect %s: %+v", id, list)
	}
	return list[0]
}

// TestBothyCLIUsage: help exits 0 on every command, a wrong command line exits 2 with one
// error, and a server that is not there gets a hint. None of it needs a sandbox.
func TestBothyCLIUsage(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, withToken("ctl-usage-0123456789abcdef"))
	out := d.ctlOK("", "--help")
	for _, want := range []string{"Exit codes:", "create", "exec", "template", "completion"} {
		if !strings.Contains(out, want) {
			t.Fatalf("--help lacks %q:\n%s", want, out)
		}
	}
	for _, cmd := range [][]string{
		{"help"}, {"create", "--help"}, {"ls", "-h"}, {"exec", "--help"}, {"cp", "--help"}, {"template", "create", "--help"},
		{"generation", "retire", "--help"}, {"lease", "ls", "--help"}, {"help", "stop"}, {"completion", "bash"},
	} {
		if out := d.ctlOK("", cmd...); !strings.Contains(out, "bothy") {
			t.Fatalf("%v: %s", cmd, out)
		}
	}
	if out := d.ctlOK("", "completion", "zsh"); !strings.Contains(out, "compdef") {
		t.Fatalf("zsh completion:\n%.300s", out)
	}
	d.wantFail(2, "unknown command", "frobnicate")
	d.wantFail(2, "unknown flag: --bogus", "ls", "--bogus")
	d.wantFail(2, "unknown shorthand flag", "stop", "x", "-z")
	d.wantFail(2, "needs at least 1 argument", "start")
	d.wantFail(2, "needs at least 2 argument", "exec", "x")
	d.wantFail(2, "-o yaml is not one of", "ls", "-o", "yaml")
	d.wantFail(2, "is not KEY=VALUE", "create", "--label", "novalue")
	d.wantFail(2, "one of SRC and DST must be ID:/path", "cp", "a", "b")
	// A refused request is 1, with the problem's detail and code once.
	d.wantFail(1, "(sandbox-not-found, HTTP 404)", "inspect", "nope")
	d.wantFail(1, "(sandbox-not-found, HTTP 404)", "start", "--timeout", "5s", "nope")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bothyBin, "ls", "--url", gone)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || stdout.Len() != 0 ||
		!strings.Contains(stderr.String(), "is bothyd running? start it with: go run ./cmd/bothyd") {
		t.Fatalf("no server: %v, stdout %q (no header), stderr %q", err, stdout.String(), stderr.String())
	}

	// The token comes from --token, $BOTHY_TOKEN or --url's flag before the file.
	cmd = exec.Command(bothyBin, "ls", "--url", d.URL, "-o", "json")
	cmd.Env = append(os.Environ(), "BOTHY_URL=", "BOTHY_TOKEN="+d.Token, "BOTHY_TOKEN_FILE=", "BOTHY_ROOT="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "[]" {
		t.Fatalf("BOTHY_TOKEN and --url: %v %s", err, out)
	}
	cmd = exec.Command(bothyBin, "--token", "wrong-token-0123456789", "--url", d.URL, "ls")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "unauthorized") {
		t.Fatalf("--token: %v %s", err, out)
	}

	var version struct{ Client, Server string }
	d.ctlJSON(&version, "version", "-o", "json")
	if version.Client == "" || version.Server == "" {
		t.Fatalf("version: %+v", version)
	}
	var info struct {
		Version string
		Runtime struct{ Kind string }
	}
	d.ctlJSON(&info, "info", "-o", "json")
	if info.Version != version.Server || info.Runtime.Kind == "" {
		t.Fatalf("info: %+v", info)
	}
	if out := d.ctlOK("", "info"); !strings.Contains(out, "Runtime:") {
		t.Fatalf("info:\n%s", out)
	}
}

// TestBothyCLICommands drives every sandbox command against the real server, with flags
// both before and after the positional arguments.
func TestBothyCLICommands(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	d := startDaemon(t, withToken("ctl-commands-0123456789abcdef"))

	// create: the id as an argument, flags after it and before it.
	if out := d.ctlOK("", "create", "c1", "--label", "team=a", "--memory", "256m", "--cpus", "1", "--pids", "128", "--env", "GREETING=hi", "--start"); out != "c1\n" {
		t.Fatalf("create printed %q", out)
	}
	var created ctlSandbox
	d.ctlJSON(&created, "create", "--label", "team=b", "-o", "json", "c2")
	if created.ID != "c2" || created.State != "provisioned" || created.Labels["team"] != "b" {
		t.Fatalf("create -o json: %+v", created)
	}
	if sb := d.inspect("c1"); sb.State != "running" || sb.Resources.MemoryMb != 256 || sb.Resources.Pids != 128 || sb.Labels["team"] != "a" {
		t.Fatalf("inspect c1: %+v", sb)
	}
	d.wantFail(1, "already-provisioned", "create", "c1")

	// ls and ps, filtered, in every format.
	var all []ctlSandbox
	d.ctlJSON(&all, "ls", "-o", "json")
	if len(all) != 2 {
		t.Fatalf("ls -o json: %+v", all)
	}
	if out := d.ctlOK("", "ps", "--state", "running", "-o", "name"); out != "c1\n" {
		t.Fatalf("ps --state running -o name: %q", out)
	}
	if out := d.ctlOK("", "ls", "-o", "name", "--label", "team=b"); out != "c2\n" {
		t.Fatalf("ls --label team=b: %q", out)
	}
	if out := d.ctlOK("", "ls", "-o", "wide"); !strings.Contains(out, "LABELS") || !strings.Contains(out, "team=a") || !strings.Contains(out, "256Mi") {
		t.Fatalf("ls -o wide:\n%s", out)
	}
	if out := d.ctlOK("", "ls"); !strings.HasPrefix(out, "ID") || !strings.Contains(out, "running") || strings.Contains(out, "\x1b[") {
		t.Fatalf("ls (no colour off a terminal):\n%q", out)
	}

	// start and stop, flags after the id; several ids at once.
	d.ctlOK("", "start", "c2", "--timeout", "30s")
	if out := d.ctlOK("", "stop", "c2", "-f"); out != "c2\n" {
		t.Fatalf("stop printed %q", out)
	}
	if sb := d.inspect("c2"); sb.State != "stopped" {
		t.Fatalf("after stop -f: %+v", sb)
	}
	d.wantFail(1, "already-running", "start", "c1")

	// exec: streamed by default, stdout and stderr apart, the command's exit code, flags
	// after the id, and what follows -- is the command's even when it looks like a flag.
	cmd := exec.Command(bothyBin, "exec", "c1", "-u", "root", "-e", "X=1", "-w", "/tmp", "--", "sh", "-c", `echo "$X $(id -u) $(pwd) $GREETING"; echo err >&2; exit 4`)
	cmd.Env = d.ctlEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 4 || stdout.String() != "1 0 /tmp hi\n" || stderr.String() != "err\n" {
		t.Fatalf("exec: %v, stdout %q, stderr %q", err, stdout.String(), stderr.String())
	}
	if out, _, code := d.ctl("line one\nline two\n", "exec", "-i", "c1", "--", "wc", "-l"); strings.TrimSpace(out) != "2" || code != 0 {
		t.Fatalf("exec -i: %q, exit %d", out, code)
	}
	if out, _, code := d.ctl("ignored\n", "exec", "c1", "--", "cat"); out != "" || code != 0 {
		t.Fatalf("exec without -i reads no stdin: %q, exit %d", out, code)
	}
	if out, _, code := d.ctl("in\n", "exec", "c1", "--buffered", "-i", "--", "sh", "-c", "cat; exit 3"); out != "in\n" || code != 3 {
		t.Fatalf("exec --buffered -i: %q, exit %d", out, code)
	}
	if out, _, code := d.ctl("", "exec", "c1", "--", "ls", "-d", "/tmp"); out != "/tmp\n" || code != 0 {
		t.Fatalf("exec with the command's own flags: %q, exit %d", out, code)
	}
	if _, stderr, code := d.ctl("", "exec", "--timeout", "1s", "c1", "--", "sleep", "30"); code == 0 || !strings.Contains(stderr, "timed out") {
		t.Fatalf("exec --timeout: exit %d, %q", code, stderr)
	}
	d.wantFail(1, "not-running", "exec", "c2", "--", "true")

	// cp both ways: a file, stdin and stdout, and a local directory as the destination.
	local := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(local, []byte("from the host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.ctlOK("", "cp", local, "c1:/home/user/")
	if out := d.ctlOK("", "cp", "c1:/home/user/in.txt", "-"); out != "from the host\n" {
		t.Fatalf("cp out to stdout: %q", out)
	}
	d.ctlOK("streamed", "cp", "-", "c1:/tmp/s.txt")
	dir := t.TempDir()
	d.ctlOK("", "cp", "c1:/tmp/s.txt", dir)
	if b, err := os.ReadFile(filepath.Join(dir, "s.txt")); err != nil || string(b) != "streamed" {
		t.Fatalf("cp into a directory: %q %v", b, err)
	}
	d.wantFail(1, "file-not-found", "cp", "c1:/nope", dir)

	// logs, with --tail.
	if out := d.ctlOK("", "logs", "c1"); out == "" {
		t.Fatal("logs: empty")
	}
	if out := d.ctlOK("", "logs", "c1", "--tail", "1"); strings.Count(strings.TrimSuffix(out, "\n"), "\n") != 0 {
		t.Fatalf("logs --tail 1:\n%s", out)
	}

	// wait: for the state it is in, and for one it does not reach in time.
	if out := d.ctlOK("", "wait", "c1", "--state", "running"); out != "running\n" {
		t.Fatalf("wait --state running: %q", out)
	}
	d.wantFail(1, "wait-timeout", "wait", "--timeout", "1s", "c2", "--state", "running")

	// pause, resume and timeout: a server without them says so plainly.
	for _, args := range [][]string{{"pause", "c1"}, {"resume", "c1"}, {"timeout", "c1", "1h"}} {
		out, stderr, code := d.ctl("", args...)
		switch {
		case code == 0 && out == "c1\n":
		case code == 1 && strings.Contains(stderr, "does not have that operation") && strings.Count(stderr, "error:") == 1:
		default:
			t.Fatalf("%v: exit %d, %q %q", args, code, out, stderr)
		}
	}

	// events: follow, filtered to a sandbox, as JSON; then replay it with --since.
	events := exec.Command(bothyBin, "events", "--sandbox", "c2", "-n", "1", "-o", "json")
	events.Env = d.ctlEnv()
	var evOut bytes.Buffer
	events.Stdout = &evOut
	if err := events.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- events.Wait() }()
	// The subscription cannot be seen from here: start and stop c2 until one of its events
	// reaches the follower.
	deadline := time.Now().Add(60 * time.Second)
	for waiting := true; waiting; {
		d.ctlOK("", "start", "c2")
		d.ctlOK("", "stop", "c2")
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("events: %v", err)
			}
			waiting = false
		default:
			if time.Now().After(deadline) {
				t.Fatal("events saw nothing of c2")
			}
		}
	}
	var ev struct {
		Seq     int64  `json:"seq"`
		Type    string `json:"type"`
		Sandbox string `json:"sandbox"`
	}
	if err := json.Unmarshal(evOut.Bytes(), &ev); err != nil || ev.Sandbox != "c2" || ev.Seq == 0 {
		t.Fatalf("events -o json: %v %q", err, evOut.String())
	}
	var replayed struct{ Seq int64 }
	d.ctlJSON(&replayed, "events", "-o", "json", "-n", "1", "--since", strconv.FormatInt(ev.Seq-1, 10))
	if replayed.Seq != ev.Seq {
		t.Fatalf("events --since %d replayed %d", ev.Seq-1, replayed.Seq)
	}
	if out := d.ctlOK("", "events", "-n", "1", "--since", strconv.FormatInt(ev.Seq-1, 10)); !strings.Contains(out, " "+ev.Type+" sandbox=c2") {
		t.Fatalf("events: %q", out)
	}

	// Templates: create, capture, clone, generations, leases, tombstone, retire, rm.
	d.ctlOK("", "template", "create", "tools")
	d.wantFail(1, "template-exists", "template", "create", "tools")
	d.ctlOK("", "exec", "c1", "-u", "root", "--", "sh", "-c", "echo tool > /opt/marker")
	d.ctlOK("", "stop", "c1")
	gen := strings.TrimSpace(d.ctlOK("", "capture", "c1", "tools"))
	if gen == "" {
		t.Fatal("capture printed no generation")
	}
	var templates []struct {
		Name        string
		Generations int
	}
	d.ctlJSON(&templates, "template", "ls", "-o", "json")
	if len(templates) != 1 || templates[0].Name != "tools" || templates[0].Generations != 1 {
		t.Fatalf("template ls: %+v", templates)
	}
	if out := d.ctlOK("", "create", "clone1", "--start", "--template", "tools"); out != "clone1\n" {
		t.Fatalf("create --template: %q", out)
	}
	if sb := d.inspect("clone1"); sb.Template == nil || sb.Template.Generation != gen {
		t.Fatalf("the clone: %+v", sb)
	}
	if out := d.ctlOK("", "exec", "clone1", "--", "cat", "/opt/marker"); out != "tool\n" {
		t.Fatalf("the clone's file: %q", out)
	}
	var gens []struct{ ID, State string }
	d.ctlJSON(&gens, "generation", "ls", "tools", "-o", "json")
	if len(gens) != 1 || gens[0].ID != gen {
		t.Fatalf("generation ls: %+v", gens)
	}
	if out := d.ctlOK("", "lease", "ls", "tools", gen); !strings.Contains(out, "clone1") {
		t.Fatalf("lease ls:\n%s", out)
	}
	var leases []struct{ ID, Sandbox string }
	d.ctlJSON(&leases, "lease", "ls", "tools", gen, "-o", "json")
	if len(leases) != 1 || leases[0].Sandbox != "clone1" {
		t.Fatalf("lease ls: %+v", leases)
	}
	// Lineage: a generation names the sandbox it was captured from, and a clone's capture
	// also the generation that sandbox was cloned from.
	if out := d.ctlOK("", "generation", "ls", "tools"); !strings.HasSuffix(strings.Fields(out)[6], "FROM") || !strings.Contains(out, "\n"+gen+" ") || !strings.HasSuffix(strings.TrimSpace(out), " c1") {
		t.Fatalf("generation ls names no source c1:\n%s", out)
	}
	d.ctlOK("", "template", "create", "tools2")
	gen2 := strings.TrimSpace(d.ctlOK("", "capture", "clone1", "tools2"))
	if out := d.ctlOK("", "generation", "ls", "tools2"); !strings.Contains(out, "clone1 (tools@"+gen+")") {
		t.Fatalf("generation ls names no parent tools@%s:\n%s", gen, out)
	}
	var gens2 []struct {
		ID     string
		Source struct{ Sandbox, Template, Generation string }
	}
	d.ctlJSON(&gens2, "generation", "ls", "tools2", "-o", "json")
	if len(gens2) != 1 || gens2[0].ID != gen2 || gens2[0].Source.Sandbox != "clone1" || gens2[0].Source.Template != "tools" || gens2[0].Source.Generation != gen {
		t.Fatalf("generation ls -o json: %+v", gens2)
	}
	d.ctlOK("", "template", "rm", "tools2")
	d.wantFail(1, "generation-leased", "generation", "retire", "tools", gen)
	if out := d.ctlOK("", "generation", "tombstone", "tools", gen); out != gen+"\n" {
		t.Fatalf("generation tombstone: %q", out)
	}
	d.ctlJSON(&gens, "generation", "ls", "-o", "json", "tools")
	if gens[0].State != "tombstoned" {
		t.Fatalf("after tombstone: %+v", gens)
	}
	d.wantFail(1, "is tombstoned", "create", "clone2", "--template", "tools")

	// Checkpoints, rollback and fork: c1 is stopped after its capture.
	if out := d.ctlOK("", "checkpoint", "create", "c1", "good"); !strings.HasPrefix(out, "good (") {
		t.Fatalf("checkpoint create: %q", out)
	}
	d.wantFail(1, "checkpoint-exists", "checkpoint", "create", "c1", "good")
	if out := d.ctlOK("", "checkpoint", "ls", "c1"); !strings.HasPrefix(out, "NAME") || !strings.Contains(out, "\ngood ") {
		t.Fatalf("checkpoint ls:\n%s", out)
	}
	var checkpoints []struct{ Name string }
	d.ctlJSON(&checkpoints, "checkpoint", "ls", "c1", "-o", "json")
	if len(checkpoints) != 1 || checkpoints[0].Name != "good" {
		t.Fatalf("checkpoint ls -o json: %+v", checkpoints)
	}
	d.ctlOK("", "start", "c1")
	d.ctlOK("", "exec", "c1", "-u", "root", "--", "sh", "-c", "echo broken > /opt/marker")
	if out := d.ctlOK("", "rollback", "c1", "good"); out != "c1 running\n" {
		t.Fatalf("rollback: %q", out)
	}
	if out := d.ctlOK("", "exec", "c1", "--", "cat", "/opt/marker"); out != "tool\n" {
		t.Fatalf("the file after the rollback: %q", out)
	}
	if out := d.ctlOK("", "fork", "c1", "--id", "fork1"); out != "fork1\n" {
		t.Fatalf("fork: %q", out)
	}
	if out := d.ctlOK("", "exec", "fork1", "--", "cat", "/opt/marker"); out != "tool\n" {
		t.Fatalf("the fork's file: %q", out)
	}
	d.wantFail(2, "none of the others can be", "fork", "c1", "--count", "2", "--id", "x")
	if out := d.ctlOK("", "checkpoint", "rm", "c1", "good"); out != "good\n" {
		t.Fatalf("checkpoint rm: %q", out)
	}
	if out := d.ctlOK("", "checkpoint", "ls", "c1", "-o", "name"); out != "" {
		t.Fatalf("checkpoint ls after rm: %q", out)
	}
	d.ctlOK("", "rm", "-f", "fork1")
	d.ctlOK("", "stop", "c1")

	// rm: refused while running, -f kills first; then the generation and template retire.
	d.wantFail(1, "sandbox-launched", "rm", "clone1")
	if out := d.ctlOK("", "rm", "clone1", "-f"); out != "clone1\n" {
		t.Fatalf("rm -f printed %q", out)
	}
	d.ctlOK("", "generation", "retire", "tools", gen)
	d.ctlOK("", "template", "rm", "tools")
	if out := d.ctlOK("", "template", "ls", "-o", "name"); out != "" {
		t.Fatalf("template ls after rm: %q", out)
	}
	if out := d.ctlOK("", "rm", "c1", "c2"); out != "c1\nc2\n" {
		t.Fatalf("rm of two: %q", out)
	}
	if out := d.ctlOK("", "ls", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls at the end: %q", out)
	}
}

// ctlEnv is the environment that [daemon.ctl] gives bothy, for a command run by hand.
func (d *daemon) ctlEnv() []string {
	d.t.Helper()
	env := append(os.Environ(), "BOTHY_URL="+d.URL, "BOTHY_TOKEN_FILE=")
	if d.Token != "" {
		env = append(env, "BOTHY_TOKEN="+d.Token)
	}
	return env
}
