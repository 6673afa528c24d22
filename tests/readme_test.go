package tests

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadmeWalkthrough runs the shell blocks of the README's "Walkthrough" section, in order,
// as a newcomer pastes them, so that the README cannot drift from what the server does. The
// blocks run in one bash with `set -euo pipefail`, so every command must succeed, and each
// curl gets --fail-with-body, since every request of the walkthrough is meant to succeed.
//
// The test changes only what a test must: bothyd is the binary under test instead of `go
// run ./cmd/bothyd` and listens on a free port instead of 7780, and bash runs in a temporary
// directory, so the README's relative `.bothy` state root is a fresh one there. `sudo` is
// the command itself: the test runs as root. wscat is the one scripts/setup installs, pinned
// (tests/testdata/wscat), and bash's standard input is a pipe that stays open until the end,
// as a terminal's would: wscat, like an interactive client, ends when its input does.
func TestReadmeWalkthrough(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the walkthrough starts sandboxes: needs root")
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := walkthroughBlocks(t, string(readme))
	port := strconv.Itoa(freePort(t))
	dir := t.TempDir()
	t.Cleanup(func() { reapSandboxes(t, filepath.Join(dir, ".bothy")) })

	var script strings.Builder
	script.WriteString(`set -euo pipefail
sudo() { "$@"; }
trap 'echo "walkthrough: failed: $BASH_COMMAND" >&2' ERR
set -x
trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT
`)
	wscatBin, err := filepath.Abs(filepath.Join("testdata", "wscat", "node_modules", ".bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(wscatBin, "wscat")); err != nil {
		t.Fatalf("the README's websocket example needs wscat: run scripts/setup, which installs it into %s (%v)", wscatBin, err)
	}
	for _, b := range blocks {
		// Without sudo's wrapper, the background job is bothyd itself, for the EXIT trap to end.
		b = strings.ReplaceAll(b, "sudo go run ./cmd/bothyd ", strconv.Quote(bothydBin)+" --listen 127.0.0.1:"+port+" ")
		b = strings.ReplaceAll(b, "127.0.0.1:7780", "127.0.0.1:"+port)
		b = strings.ReplaceAll(b, "curl -s ", "curl -s --fail-with-body ")
		script.WriteString(b)
		script.WriteString("\n")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+wscatBin+string(os.PathListSeparator)+os.Getenv("PATH"))
	stdin, keepOpen, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	defer keepOpen.Close()
	cmd.Stdin = stdin
	// Should the script hang, end everything it started, not bash alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if err != nil {
		t.Fatalf("the walkthrough failed: %v\nscript:\n%s\nstdout:\n%s\nstderr:\n%s", err, script.String(), stdout.String(), stderr.String())
	}
	// What the README's comments promise, in the output.
	out := stdout.String()
	for _, want := range []string{`"id":"demo"`, `"state":"running"`, `hello from demo\n1000\n`, "hello from the host", `"state":"paused"`, `"state":"stopped"`,
		"^Abin\n", `{"type":"exit","exit_code":0,"signal":null,`} {
		if !strings.Contains(out, want) {
			t.Errorf("the walkthrough's output lacks %q:\n%s", want, out)
		}
	}
	// bothyd says where its (relative, by default) state root is, as an absolute path.
	if abs := filepath.Join(dir, ".bothy"); !strings.Contains(stderr.String(), `"root":`+strconv.Quote(abs)) {
		t.Errorf("bothyd's log does not name its state root %s:\n%s", abs, stderr.String())
	}
}

// walkthroughBlocks returns the ```sh blocks of the README's "Walkthrough" section (up to the
// next second-level heading), its subsections included.
func walkthroughBlocks(t *testing.T, readme string) []string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## Walkthrough\n")
	if !ok {
		t.Fatal("the README has no Walkthrough section")
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	var blocks []string
	for {
		_, rest, ok := strings.Cut(section, "\n```sh\n")
		if !ok {
			break
		}
		block, after, ok := strings.Cut(rest, "\n```\n")
		if !ok {
			t.Fatal("an unterminated ```sh block in the README's walkthrough")
		}
		blocks = append(blocks, block)
		section = "\n" + after
	}
	if len(blocks) < 2 {
		t.Fatalf("the README's walkthrough has %d sh blocks, want at least 2", len(blocks))
	}
	return blocks
}
