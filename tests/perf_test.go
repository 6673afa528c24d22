package tests

import (
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// serverOnlyModules are modules that the server links and the sandbox side must not: their
// package initialisers (the JSON-schema compiler of the request validator above all) would run
// in every process of every sandbox start (issue 17).
var serverOnlyModules = []string{
	"github.com/getkin/kin-openapi",
	"github.com/santhosh-tekuri/jsonschema/v6",
	"github.com/prometheus/client_golang",
	"github.com/go-chi/chi/v5",
}

// readmeBinary is bothyd built as the README's `go run ./cmd/bothyd` builds it (copied out
// of the go command by -exec cp, byte for byte), alone in a directory of its own.
func readmeBinary(t testing.TB) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "bothyd")
	cmd := exec.Command("go", "run", "-exec", "cp", "github.com/bothy/bothy/cmd/bothyd", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run -exec cp: %v: %s", err, b)
	}
	return out
}

// builtAlone is the test's `go build` of bothyd, copied alone into a directory of its own.
func builtAlone(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "bothyd")
	b, err := os.ReadFile(bothydBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDefaultRuntimeIsSlim: bothyd started as the README starts it (`go run`), or as a plain
// `go build` binary, without bothyd-runtime beside it, runs its sandboxes' shim and init from
// a binary that links none of the server's modules, and the same one again after a restart
// (so that its running sandboxes keep their runtime identity), and `bothyd check` of the same
// binary judges its sandboxes as the server's own.
func TestDefaultRuntimeIsSlim(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name string
		bin  func(*testing.T) string
	}{{"go run", func(t *testing.T) string { return readmeBinary(t) }}, {"go build", builtAlone}} {
		t.Run(c.name, func(t *testing.T) {
			bin := c.bin(t)
			d := startDaemon(t, withBinary(bin))
			d.create("slim", true)
			first := sandboxExecutables(t, d.Root, "slim")
			if len(first) != 2 {
				t.Fatalf("want the shim and the init of the sandbox, found %v", first)
			}
			for role, exe := range first {
				assertSlim(t, role, exe, bin)
			}
			// `bothyd check` of the same binary makes the same choice, so the sandbox is
			// no runtime mismatch to it.
			out, err := exec.Command(bin, "check", "--root", d.Root, "--json").Output()
			if err != nil {
				t.Fatalf("bothyd check: %v\n%s", err, out)
			}
			if strings.Contains(string(out), "runtime-mismatch") {
				t.Fatalf("bothyd check takes the sandbox for one of another runtime:\n%s", out)
			}
			d.Stop()
			d.start()
			// A sandbox of another runtime identity would answer 409 runtime-mismatch here.
			if got := d.exec("slim", map[string]any{"command": []string{"true"}}); got.ExitCode != 0 {
				t.Fatalf("exec after the restart: %+v", got)
			}
			d.create("slim2", true)
			if again := sandboxExecutables(t, d.Root, "slim2"); again["shim"] != first["shim"] {
				t.Fatalf("after a restart the shim runs %s, before %s", again["shim"], first["shim"])
			}
		})
	}
}

// sandboxExecutables maps the roles of the runtime processes of sandbox id to the path of
// the executable each runs (the content hash in a provisioned runtime's name tells them apart).
func sandboxExecutables(t *testing.T, root, id string) map[string]string {
	t.Helper()
	exes := map[string]string{}
	for _, p := range listProcesses(t, root) {
		if filepath.Base(p.Dir) != id {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.ID.Pid))
		if err != nil {
			t.Fatal(err)
		}
		exes[string(p.Role)] = exe
	}
	return exes
}

// assertSlim fails unless exe (a sandbox process's) is another binary than the server's and
// links no server-only module.
func assertSlim(t *testing.T, role, exe, server string) {
	t.Helper()
	if exe == server {
		t.Fatalf("the sandbox's %s runs the server binary %s", role, exe)
	}
	info, err := buildinfo.ReadFile(exe)
	if err != nil {
		t.Fatalf("the %s's executable %s: %v", role, exe, err)
	}
	for _, dep := range info.Deps {
		for _, heavy := range serverOnlyModules {
			if dep.Path == heavy {
				t.Fatalf("the sandbox's %s runs %s, which links the server's %s", role, exe, heavy)
			}
		}
	}
}
