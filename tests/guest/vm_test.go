package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vm is the booted guest, as scripts/guest/run's environment describes it.
type vm struct {
	sshPort, key string
	// api is bothyd's API as the host reaches it: QEMU's forward to the guest's port 7780.
	api string
	// serial is the guest's serial console log, quoted when a step fails at boot.
	serial string
}

// guestVM reads the guest's environment, or skips: the suite changes the machine it runs on,
// so it runs only in a guest scripts/guest/run booted.
func guestVM(t *testing.T) *vm {
	t.Helper()
	g := &vm{sshPort: os.Getenv("BOTHY_GUEST_SSH_PORT"), key: os.Getenv("BOTHY_GUEST_KEY"),
		api: os.Getenv("BOTHY_GUEST_API"), serial: os.Getenv("BOTHY_GUEST_SERIAL")}
	if g.sshPort == "" || g.key == "" || g.api == "" {
		t.Skip("no guest: this suite runs in the VM that scripts/guest/test boots (BOTHY_GUEST_SSH_PORT, BOTHY_GUEST_KEY and BOTHY_GUEST_API unset)")
	}
	return g
}

func (g *vm) sshArgs() []string {
	return []string{"-q", "-i", g.key, "-p", g.sshPort, "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
		"-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=6"}
}

// run runs script with sh as root in the guest and returns its output, stdout and stderr
// together, and its error (an *exec.ExitError for a non-zero exit).
func (g *vm) run(timeout time.Duration, script string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", append(g.sshArgs(), "root@127.0.0.1", script)...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (after %s)", ctx.Err(), timeout)
	}
	return string(out), err
}

// must runs script in the guest and ends the test if it fails.
func (g *vm) must(t testing.TB, script string) string {
	t.Helper()
	out, err := g.run(5*time.Minute, script)
	if err != nil {
		t.Fatalf("in the guest: %s: %v\n%s", script, err, out)
	}
	return out
}

// put copies a file of the host's to path in the guest.
func (g *vm) put(t testing.TB, local, path string) {
	t.Helper()
	args := append(g.sshArgs(), local, "root@127.0.0.1:"+path)
	for i, a := range args { // scp spells the port -P
		if a == "-p" {
			args[i] = "-P"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "scp", args...).CombinedOutput(); err != nil {
		t.Fatalf("copying %s to the guest's %s: %v\n%s", local, path, err, out)
	}
}

// up says whether the guest's ssh answers.
func (g *vm) up() bool {
	_, err := g.run(15*time.Second, "true")
	return err == nil
}

// serialTail is the end of the serial console, for a failure at boot.
func (g *vm) serialTail() string {
	b, err := os.ReadFile(g.serial)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// waitFor polls cond until it holds or the deadline passes, then ends the test naming what it
// waited for.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// api does one request to bothyd's API with the token and decodes a JSON answer into out
// (when not nil), returning the status. For what the Go SDK has no field for (a network
// policy at create).
func (s *suite) api(method, path string, in, out any) (int, string, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, "", err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.g.api+path, body)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 3 * time.Minute}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, string(b), err
		}
	}
	return resp.StatusCode, string(b), nil
}

// repoRoot is the checkout the suite runs from (go test runs in tests/guest).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// cgroupOf is the path, under /sys/fs/cgroup in the guest, of the sandbox's cgroup: the
// directory named after its id (shim.CgroupLeaf: the id, a dot, a hash), wherever the
// cgroup parent puts it.
func (s *suite) cgroupOf(t testing.TB, id string) string {
	t.Helper()
	out := strings.TrimSpace(s.g.must(t, fmt.Sprintf("find /sys/fs/cgroup -mindepth 1 -maxdepth 8 -type d -name '%s.*' | head -1", id)))
	if out == "" {
		t.Fatalf("no cgroup of the sandbox %s in the guest", id)
	}
	return out
}

// keyed reads the number after key in a "key value" cgroup file's content.
func keyed(content, key string) int64 {
	for _, line := range strings.Split(content, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return -1
}
