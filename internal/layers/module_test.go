package layers

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// platforms are the builds whose import graphs are checked: files with build constraints
// (x_linux.go beside x_other.go) import different packages, and a rule must hold in each.
var platforms = []struct{ goos, goarch string }{
	{"linux", "amd64"},
	{"linux", "arm64"},
	{"darwin", "arm64"},
}

// moduleRoot is the directory of the go.mod this test belongs to.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == "/dev/null" {
		t.Fatalf("go env GOMOD = %q: the test must run inside the module", gomod)
	}
	return filepath.Dir(gomod)
}

// TestModule checks bothyd's own import graph against [Rules].
func TestModule(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	for _, p := range platforms {
		t.Run(p.goos+"/"+p.goarch, func(t *testing.T) {
			t.Parallel()
			g, err := Load(t.Context(), root, "GOOS="+p.goos, "GOARCH="+p.goarch, "CGO_ENABLED=0")
			if err != nil {
				t.Fatal(err)
			}
			// A graph that lost its edges would pass every rule; these are known to exist.
			for _, edge := range [][2]string{{"handlers", "supervisor"}, {"cmd/bothyd-runtime", "runtime/namespace/shim"}} {
				if !imports(g, edge[0], edge[1]) {
					t.Fatalf("the loaded graph has no edge %s -> %s; the loader is broken", edge[0], edge[1])
				}
			}
			// A rule that constrains no package (a package renamed under it) checks nothing.
			for _, r := range Rules {
				if !appliesToAny(g, r) {
					t.Errorf("rule %s applies to no package of %s", r.Name, g.Module)
				}
			}
			for _, v := range Check(g, Classes, Rules) {
				t.Error(v)
			}
		})
	}
}

func imports(g *Graph, from, to string) bool {
	for _, imp := range g.Imports[g.Module+"/"+from] {
		if imp == g.Module+"/"+to {
			return true
		}
	}
	return false
}

func appliesToAny(g *Graph, r Rule) bool {
	for path := range g.Imports {
		if rel, ok := g.Rel(path); ok && r.Applies(Pkg{Path: rel, Module: true, Class: Classes[rel]}) {
			return true
		}
	}
	return false
}
