package layers

import (
	"slices"
	"strings"
	"testing"
)

// syntheticClasses classifies the packages of the synthetic module "sb" the way [Classes]
// classifies bothyd's, plus a new leaf.
var syntheticClasses = map[string]Class{
	"agent":                     Sandbox,
	"control":                   Sandbox,
	"platform":                  Sandbox,
	"runtime":                   Sandbox,
	"runtime/namespace/shim":    Sandbox,
	"ids":                       Sandbox,
	"naming":                    Sandbox,
	"runtime/namespace/seccomp": Host,
	"store":                     Host,
	"store/template":            Host,
	"supervisor":                Host,
	"runtime/namespace":         Host,
	"check":                     Host,
	"events":                    HTTP,
	"handlers":                  HTTP,
	"server":                    HTTP,
	"cmd/bothyd":                Command,
	"cmd/bothyd-runtime":        Command,
	"tests":                     Tool,
}

// cleanGraph is a synthetic module that keeps every rule; each case below adds edges to it.
func cleanGraph() map[string][]string {
	return map[string][]string{
		"sb/agent":                            {"sb/control", "sb/platform", "os"},
		"sb/control":                          {"github.com/hashicorp/yamux"},
		"sb/platform":                         {"golang.org/x/sys/unix", "sb/naming"},
		"sb/naming":                           {"crypto/rand"},
		"sb/runtime/namespace/seccomp":        {"sb/platform", "github.com/moby/profiles/seccomp"},
		"sb/runtime":                          {"sb/platform"},
		"sb/runtime/namespace/shim":           {"sb/agent", "sb/runtime", "sb/ids"},
		"sb/ids":                              {"strings"},
		"sb/store":                            {"sb/runtime", "sb/platform", "sb/ids"},
		"sb/store/template":                   {"sb/store"},
		"sb/supervisor":                       {"sb/runtime", "sb/store", "sb/store/template", "sb/control"},
		"sb/runtime/namespace":                {"sb/runtime", "sb/runtime/namespace/shim", "sb/runtime/namespace/seccomp", "sb/control"},
		"sb/check":                            {"sb/store", "sb/supervisor"},
		"sb/events":                           {"net/http"},
		"sb/handlers":                         {"sb/supervisor", "sb/events", "github.com/go-chi/chi/v5", "github.com/gorilla/websocket"},
		"sb/server":                           {"sb/handlers", "net/http", "github.com/go-chi/chi/v5/middleware"},
		"sb/cmd/bothyd":                       {"sb/server", "sb/runtime/namespace", "sb/runtime/namespace/shim", "sb/check"},
		"sb/cmd/bothyd-runtime":               {"sb/runtime/namespace/shim", "os"},
		"sb/tests":                            {"sb/server", "net/http"},
		"net/http":                            {"net/url", "crypto/tls"},
		"github.com/go-chi/chi/v5/middleware": {"net/http"},
		"github.com/hashicorp/yamux":          {"net"},
		"github.com/moby/profiles/seccomp":    {"github.com/opencontainers/runtime-spec/specs-go"},
		"github.com/some/httplib":             {"net/http"},
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// edit changes the clean graph and the classes into the case's.
		edit func(imports map[string][]string, classes map[string]Class)
		// want is each reported violation as "rule: package -> dep".
		want []string
		// chain, when set, is the import chain of the first violation.
		chain []string
	}{
		{name: "clean"},
		{
			name: "new package without a class",
			edit: func(g map[string][]string, _ map[string]Class) { g["sb/names"] = []string{"strings"} },
			want: []string{"classified: names -> "},
		},
		{
			name: "imported package of the module without a class",
			edit: func(g map[string][]string, _ map[string]Class) { g["sb/store"] = append(g["sb/store"], "sb/names") },
			// An unclassified package is no package the host side may import either.
			want: []string{"classified: names -> ", "below-http: store -> names"},
		},
		{
			name: "class for a package that is gone",
			edit: func(_ map[string][]string, c map[string]Class) { c["supervisor/agent"] = Sandbox },
			want: []string{"classified: supervisor/agent -> "},
		},
		{
			name: "agent imports the store",
			edit: func(g map[string][]string, _ map[string]Class) { g["sb/agent"] = append(g["sb/agent"], "sb/store") },
			// The agent is linked into bothyd-runtime, which therefore links the store too.
			want: []string{
				"sandbox-side: agent -> store",
				"bothyd-runtime-links: cmd/bothyd-runtime -> store",
			},
		},
		{
			name: "new leaf imports the supervisor",
			edit: func(g map[string][]string, _ map[string]Class) { g["sb/ids"] = []string{"sb/supervisor"} },
			want: []string{
				"sandbox-side: ids -> supervisor",
				"bothyd-runtime-links: cmd/bothyd-runtime -> supervisor",
			},
		},
		{
			name: "control imports the namespace driver",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/control"] = append(g["sb/control"], "sb/runtime/namespace")
			},
			want: []string{
				"no-concrete-runtime: control -> runtime/namespace",
				"sandbox-side: control -> runtime/namespace",
				"bothyd-runtime-links: cmd/bothyd-runtime -> runtime/namespace",
			},
		},
		{
			name: "store imports net/http",
			edit: func(g map[string][]string, _ map[string]Class) { g["sb/store"] = append(g["sb/store"], "net/http") },
			want: []string{"no-http-below-handlers: store -> net/http"},
		},
		{
			name: "supervisor links net/http through a library",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/supervisor"] = append(g["sb/supervisor"], "github.com/some/httplib")
			},
			want:  []string{"no-http-below-handlers: supervisor -> net/http"},
			chain: []string{"supervisor", "github.com/some/httplib", "net/http"},
		},
		{
			name: "platform imports gorilla, reported at platform alone",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/platform"] = append(g["sb/platform"], "github.com/gorilla/websocket")
			},
			// Every package below handlers links platform, but the walk stops at a package
			// that the rule judges on its own; bothyd-runtime has its own rule.
			want: []string{
				"no-http-below-handlers: platform -> github.com/gorilla/websocket",
				"bothyd-runtime-links: cmd/bothyd-runtime -> github.com/gorilla/websocket",
			},
		},
		{
			name: "check imports a chi subpackage",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/check"] = append(g["sb/check"], "github.com/go-chi/chi/v5/middleware")
			},
			want:  []string{"no-http-below-handlers: check -> github.com/go-chi/chi/v5/middleware"},
			chain: []string{"check", "github.com/go-chi/chi/v5/middleware"},
		},
		{
			name: "store/template imports the event stream",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/store/template"] = append(g["sb/store/template"], "sb/events")
			},
			want: []string{
				"below-http: store/template -> events",
				"no-http-below-handlers: store/template -> net/http",
			},
		},
		{
			name: "supervisor imports the namespace runtime",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/supervisor"] = append(g["sb/supervisor"], "sb/runtime/namespace")
			},
			want: []string{"no-concrete-runtime: supervisor -> runtime/namespace"},
		},
		{
			name: "check imports the shim",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/check"] = append(g["sb/check"], "sb/runtime/namespace/shim")
			},
			want: []string{"no-concrete-runtime: check -> runtime/namespace/shim"},
		},
		{
			name: "handlers import a concrete runtime of another name",
			edit: func(g map[string][]string, c map[string]Class) {
				g["sb/runtime/vm"] = []string{"sb/runtime"}
				c["runtime/vm"] = Host
				g["sb/handlers"] = append(g["sb/handlers"], "sb/runtime/vm")
			},
			want: []string{"no-concrete-runtime: handlers -> runtime/vm"},
		},
		{
			name: "one runtime imports another",
			edit: func(g map[string][]string, c map[string]Class) {
				g["sb/runtime/vm"] = []string{"sb/runtime/namespace"}
				c["runtime/vm"] = Host
			},
			want: []string{"no-concrete-runtime: runtime/vm -> runtime/namespace"},
		},
		{
			name: "handlers import the stores, the runtime, the control protocol and the agent",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/handlers"] = append(g["sb/handlers"], "sb/store", "sb/store/template", "sb/runtime", "sb/control", "sb/agent")
			},
			want: []string{
				"handlers-through-supervisor: handlers -> agent",
				"handlers-through-supervisor: handlers -> control",
				"handlers-through-supervisor: handlers -> runtime",
				"handlers-through-supervisor: handlers -> store",
				"handlers-through-supervisor: handlers -> store/template",
			},
		},
		{
			name: "bothyd-runtime links the server through the shim",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/runtime/namespace/shim"] = append(g["sb/runtime/namespace/shim"], "sb/server")
			},
			// The HTTP layer is not judged by the HTTP rule, so the shim is, for each library
			// that it now links through the server.
			want: []string{
				"sandbox-side: runtime/namespace/shim -> server",
				"no-http-below-handlers: runtime/namespace/shim -> net/http",
				"no-http-below-handlers: runtime/namespace/shim -> github.com/go-chi/chi/v5",
				"no-http-below-handlers: runtime/namespace/shim -> github.com/go-chi/chi/v5/middleware",
				"no-http-below-handlers: runtime/namespace/shim -> github.com/gorilla/websocket",
				"bothyd-runtime-links: cmd/bothyd-runtime -> server",
			},
		},
		{
			name: "bothyd-runtime imports the namespace driver",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/cmd/bothyd-runtime"] = append(g["sb/cmd/bothyd-runtime"], "sb/runtime/namespace")
			},
			// The command may import a concrete runtime; what it may link is its own rule.
			want:  []string{"bothyd-runtime-links: cmd/bothyd-runtime -> runtime/namespace"},
			chain: []string{"cmd/bothyd-runtime", "runtime/namespace"},
		},
		{
			name: "bothyd-runtime links net/http through a library",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/cmd/bothyd-runtime"] = append(g["sb/cmd/bothyd-runtime"], "github.com/some/httplib")
			},
			want: []string{"bothyd-runtime-links: cmd/bothyd-runtime -> net/http"},
		},
		{
			name: "platform links the seccomp profile library again",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/platform"] = append(g["sb/platform"], "github.com/moby/profiles/seccomp")
			},
			want:  []string{"bothyd-runtime-links: cmd/bothyd-runtime -> github.com/moby/profiles/seccomp"},
			chain: []string{"cmd/bothyd-runtime", "runtime/namespace/shim", "agent", "platform", "github.com/moby/profiles/seccomp"},
		},
		{
			name: "the shim imports the seccomp compiler",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/runtime/namespace/shim"] = append(g["sb/runtime/namespace/shim"], "sb/runtime/namespace/seccomp")
			},
			// The compiler is the namespace runtime's own package, but it is host-side.
			want: []string{
				"sandbox-side: runtime/namespace/shim -> runtime/namespace/seccomp",
				"bothyd-runtime-links: cmd/bothyd-runtime -> runtime/namespace/seccomp",
			},
		},
		{
			name: "the server imports the end-to-end suite",
			edit: func(g map[string][]string, _ map[string]Class) { g["sb/server"] = append(g["sb/server"], "sb/tests") },
			want: []string{"tools-apart: server -> tests"},
		},
		{
			name: "a host package may import what the sandbox side has",
			edit: func(g map[string][]string, _ map[string]Class) {
				g["sb/store"] = append(g["sb/store"], "sb/agent", "sb/control")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			imports := cleanGraph()
			classes := map[string]Class{}
			for k, v := range syntheticClasses {
				classes[k] = v
			}
			if tt.edit != nil {
				tt.edit(imports, classes)
			}
			got := Check(&Graph{Module: "sb", Imports: imports}, classes, Rules)
			var keys []string
			for _, v := range got {
				keys = append(keys, v.Rule+": "+v.Package+" -> "+v.Dep)
			}
			// Check sorts by package; the cases list violations in whatever order reads best.
			slices.Sort(keys)
			want := slices.Sorted(slices.Values(tt.want))
			if !slices.Equal(keys, want) {
				t.Errorf("Check reported\n\t%s\nwant\n\t%s", strings.Join(keys, "\n\t"), strings.Join(want, "\n\t"))
			}
			if tt.chain != nil && (len(got) != 1 || !slices.Equal(got[0].Chain, tt.chain)) {
				t.Errorf("Check reported %v, want one violation with the chain %v", got, tt.chain)
			}
		})
	}
}

func TestViolationString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		v    Violation
		want string
	}{
		{
			Violation{Rule: "r", Package: "store", Dep: "net/http", Chain: []string{"store", "net/http"}, Why: "because"},
			"store imports net/http (store -> net/http) [r]: because",
		},
		{
			Violation{Rule: "r", Package: "store", Dep: "net/http", Chain: []string{"store", "x", "net/http"}, Why: "because"},
			"store links net/http (store -> x -> net/http) [r]: because",
		},
		{Violation{Rule: "classified", Package: "names", Why: "add it"}, "names [classified]: add it"},
	}
	for _, tt := range tests {
		if got := tt.v.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestDecode(t *testing.T) {
	t.Parallel()
	const stream = `{"ImportPath": "net/http", "Imports": ["net/url"]}
{"ImportPath": "sb/store", "Imports": ["net/http"], "Module": {"Path": "sb", "Main": true}}
{"ImportPath": "github.com/x/y", "Module": {"Path": "github.com/x/y"}}
`
	g, err := decode(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if g.Module != "sb" || !slices.Equal(g.Imports["sb/store"], []string{"net/http"}) || len(g.Imports) != 3 {
		t.Errorf("decode = %+v", g)
	}

	broken := `{"ImportPath": "sb/store", "Module": {"Path": "sb", "Main": true}, "Error": {"Err": "no Go files"}}`
	if _, err := decode(strings.NewReader(broken)); err == nil || !strings.Contains(err.Error(), "no Go files") {
		t.Errorf("decode of a package with an error: %v, want that error", err)
	}
	if _, err := decode(strings.NewReader(`{"ImportPath": "net/http"}`)); err == nil {
		t.Error("decode of a stream without the main module succeeded")
	}
}
