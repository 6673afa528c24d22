package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNoHostSide keeps this binary the sandbox side alone: a host-side package, or the
// seccomp profile library that only the host-side compiler needs, would make every sandbox
// start pay for package initialisers it never uses.
func TestLinksNoHostSide(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not installed, so the dependencies cannot be listed")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const mod = "github.com/sandboxd/sandboxd/"
	forbidden := []string{
		mod + "store", mod + "supervisor", mod + "server", mod + "handlers", mod + "check",
		mod + "events", mod + "metrics", mod + "openapi", mod + "web",
		mod + "runtime/namespace", mod + "runtime/namespace/seccomp",
		"github.com/moby/profiles/seccomp", "github.com/opencontainers/runtime-spec/specs-go",
		"net/http",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %q", deps)
	}
	have := map[string]bool{}
	for _, d := range deps {
		have[d] = true
	}
	for _, f := range forbidden {
		for d := range have {
			if d == f || strings.HasPrefix(d, f+"/") && !strings.HasPrefix(d, mod+"runtime/namespace/shim") {
				t.Errorf("sandboxd-runtime links %s", d)
			}
		}
	}
	if !have[mod+"runtime/namespace/shim"] {
		t.Errorf("sandboxd-runtime does not link the shim; the listing is %q", deps)
	}
}
