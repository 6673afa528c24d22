package layers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
)

// Class is where a package of the module stands. The zero Class is [Unclassified], which
// [Check] reports: every package of the module must have one.
type Class int

const (
	// Unclassified is a package that [Classes] does not name.
	Unclassified Class = iota
	// Sandbox is code that runs inside a sandbox or is linked into bothyd-runtime: the
	// agent, the shim and init, and the leaves they share with the host (the control
	// protocol, the runtime interface, the record codec, the OS wrappers, the error codes).
	Sandbox
	// Host is host-side code below the HTTP layer: the stores, the supervisor, a runtime's
	// host-side driver, the checker.
	Host
	// HTTP is the host-side HTTP layer: handlers, server, the generated API and its
	// client, the event stream, metrics, the dashboard.
	HTTP
	// Command is a main package under cmd/: it wires the rest together and may import any
	// class.
	Command
	// Tool is test and build tooling (the end-to-end suite, this package): it may import
	// anything and nothing imports it.
	Tool
)

func (c Class) String() string {
	switch c {
	case Sandbox:
		return "sandbox"
	case Host:
		return "host"
	case HTTP:
		return "http"
	case Command:
		return "command"
	case Tool:
		return "tool"
	}
	return "unclassified"
}

// Graph is the import graph of a build: every package the build contains, by import path,
// with the import paths of the packages its non-test files import.
type Graph struct {
	// Module is the main module's path; the packages under it are the ones [Check] judges.
	Module string
	// Imports holds every package of the build, the standard library and other modules
	// included, so that a rule can follow a chain through them.
	Imports map[string][]string
}

// Rel returns path relative to the module ("store/template", or "." for the module's root
// package) and whether path is in the module at all.
func (g *Graph) Rel(path string) (string, bool) {
	if path == g.Module {
		return ".", true
	}
	if rel, ok := strings.CutPrefix(path, g.Module+"/"); ok {
		return rel, true
	}
	return "", false
}

// Pkg is one end of an import edge as a [Rule] sees it.
type Pkg struct {
	// Path is module-relative ("store") for a package of the module and the full import
	// path ("net/http") for any other.
	Path string
	// Module says whether the package is in the module; only then is Class meaningful.
	Module bool
	Class  Class
}

// Rule is one import rule.
type Rule struct {
	// Name identifies the rule in a report.
	Name string
	// Why is the reason for the rule, said to whoever breaks it.
	Why string
	// Applies reports whether the rule constrains the package of the module from.
	Applies func(from Pkg) bool
	// Transitive makes the rule about everything from links rather than what it imports
	// directly. The walk does not pass through another package of the module to which the
	// rule applies too: that package is judged on its own, so that a violation is reported
	// once, at the package nearest to the forbidden import.
	Transitive bool
	// Forbids reports whether from may not depend on dep.
	Forbids func(from, dep Pkg) bool
}

// Violation is one broken rule.
type Violation struct {
	// Rule is the broken rule's name, "classified" for a package missing from the classes
	// or a class given to a package that does not exist.
	Rule string
	// Package and Dep are module-relative for packages of the module; Dep is empty for a
	// classification violation.
	Package, Dep string
	// Chain is the import chain from Package to Dep, both included; two entries for a
	// direct import.
	Chain []string
	Why   string
}

func (v Violation) String() string {
	if v.Dep == "" {
		return fmt.Sprintf("%s [%s]: %s", v.Package, v.Rule, v.Why)
	}
	verb := "imports"
	if len(v.Chain) > 2 {
		verb = "links"
	}
	return fmt.Sprintf("%s %s %s (%s) [%s]: %s", v.Package, verb, v.Dep, strings.Join(v.Chain, " -> "), v.Rule, v.Why)
}

// Check judges every package of g's module against rules, given each package's class by
// its module-relative path. It reports, sorted by package: each package of the module that
// classes does not name, each name in classes that is not a package of the module, and each
// import a rule forbids.
func Check(g *Graph, classes map[string]Class, rules []Rule) []Violation {
	var out []Violation
	pkg := func(path string) Pkg {
		if rel, ok := g.Rel(path); ok {
			return Pkg{Path: rel, Module: true, Class: classes[rel]}
		}
		return Pkg{Path: path}
	}

	// The module's packages are the graph's keys under the module path, and any import of
	// such a path even if the graph lacks it (a malformed graph must not hide a package).
	seen := map[string]bool{}
	var mods []string
	add := func(path string) {
		if _, ok := g.Rel(path); ok && !seen[path] {
			seen[path] = true
			mods = append(mods, path)
		}
	}
	for path, imports := range g.Imports {
		add(path)
		for _, imp := range imports {
			add(imp)
		}
	}
	sort.Strings(mods)

	for _, path := range mods {
		if p := pkg(path); p.Class == Unclassified {
			out = append(out, Violation{Rule: "classified", Package: p.Path,
				Why: "every package of the module must have a class in layers.Classes, so that the import rules apply to it; add it there"})
		}
	}
	for rel := range classes {
		path := g.Module + "/" + rel
		if rel == "." {
			path = g.Module
		}
		if !seen[path] {
			out = append(out, Violation{Rule: "classified", Package: rel,
				Why: "layers.Classes names a package that the module does not have; remove or rename its entry"})
		}
	}

	for _, path := range mods {
		from := pkg(path)
		for _, r := range rules {
			if !r.Applies(from) {
				continue
			}
			if !r.Transitive {
				for _, imp := range g.Imports[path] {
					if dep := pkg(imp); r.Forbids(from, dep) {
						out = append(out, Violation{Rule: r.Name, Package: from.Path, Dep: dep.Path,
							Chain: []string{from.Path, dep.Path}, Why: r.Why})
					}
				}
				continue
			}
			out = append(out, walk(g, path, r, pkg)...)
		}
	}

	slices.SortStableFunc(out, func(a, b Violation) int {
		if c := strings.Compare(a.Package, b.Package); c != 0 {
			return c
		}
		if c := strings.Compare(a.Rule, b.Rule); c != 0 {
			return c
		}
		return strings.Compare(a.Dep, b.Dep)
	})
	return out
}

// walk is a breadth-first walk of everything start links, reporting each dependency r
// forbids with its shortest import chain.
func walk(g *Graph, start string, r Rule, pkg func(string) Pkg) []Violation {
	from := pkg(start)
	parent := map[string]string{start: ""}
	queue := []string{start}
	var out []Violation
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		for _, imp := range g.Imports[path] {
			if _, ok := parent[imp]; ok {
				continue
			}
			parent[imp] = path
			dep := pkg(imp)
			if r.Forbids(from, dep) {
				var chain []string
				for p := imp; p != ""; p = parent[p] {
					chain = append(chain, pkg(p).Path)
				}
				slices.Reverse(chain)
				out = append(out, Violation{Rule: r.Name, Package: from.Path, Dep: dep.Path, Chain: chain, Why: r.Why})
				continue
			}
			if dep.Module && r.Applies(dep) {
				continue // judged on its own
			}
			queue = append(queue, imp)
		}
	}
	return out
}

// Load returns the import graph of the non-test code of the module in dir, as
// `go list -deps -json ./...` run there sees it, with env (such as "GOOS=darwin") added to
// the environment. A package that fails to load is an error: a rule must not pass because
// part of the graph is missing.
func Load(ctx context.Context, dir string, env ...string) (*Graph, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-json", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go list -deps -json ./... in %s (%s): %w: %s", dir, strings.Join(env, " "), err, stderr.Bytes())
	}
	return decode(&stdout)
}

// decode reads the stream of JSON objects that go list -json writes.
func decode(r io.Reader) (*Graph, error) {
	g := &Graph{Imports: map[string][]string{}}
	dec := json.NewDecoder(r)
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Module     *struct {
				Path string
				Main bool
			}
			Error *struct{ Err string }
		}
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("decoding go list output: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list: package %s: %s", p.ImportPath, p.Error.Err)
		}
		if p.Module != nil && p.Module.Main {
			if g.Module != "" && g.Module != p.Module.Path {
				return nil, fmt.Errorf("go list reports two main modules, %s and %s", g.Module, p.Module.Path)
			}
			g.Module = p.Module.Path
		}
		g.Imports[p.ImportPath] = p.Imports
	}
	if g.Module == "" {
		return nil, errors.New("go list reported no package of the main module")
	}
	return g, nil
}
