package layers

import (
	"slices"
	"strings"
)

// Classes gives every package of the bothyd module its [Class], by module-relative path.
// A new package is added here by whoever creates it; until then the test fails. A small
// leaf helper that the sandbox side may use (an ids or names package) is [Sandbox]: the
// sandbox rules then keep it free of host-side imports, and the host may still use it.
var Classes = map[string]Class{
	"agent":   Sandbox,
	"control": Sandbox,
	"errcode": Sandbox,
	// The rate-limited log handler: a leaf on the standard library, for the server and
	// for whatever logs what a sandbox causes (issue 37).
	"internal/ratelog":       Sandbox,
	"naming":                 Sandbox,
	"platform":               Sandbox,
	"record":                 Sandbox,
	"runtime":                Sandbox,
	"runtime/namespace/shim": Sandbox,
	// The microvm runtime's shim, its guest init and the port multiplexer they share run
	// from the runtime binary (the guest init inside the VM): sandbox side.
	"runtime/microvm/guest":   Sandbox,
	"runtime/microvm/portmux": Sandbox,
	"runtime/microvm/qmp":     Sandbox,
	"runtime/microvm/shim":    Sandbox,
	"check":                   Host,
	"internal/systemd":        Host,
	"network":                 Host,
	"portlink":                Host,
	"idempotency":             Host,
	"checkpoint":              Host,
	"usage":                   Host,
	"idle":                    Host,
	// The secrets' store (docs/secrets.md): sealed values in the state root.
	"secret":                    Host,
	"runtime/microvm":           Host,
	"runtime/namespace":         Host,
	"runtime/namespace/seccomp": Host,
	"store":                     Host,
	"store/image":               Host,
	"store/template":            Host,
	"supervisor":                Host,
	"volume":                    Host,

	// E2B compatibility (docs/e2b.md): the control plane and envd plane served to E2B's
	// SDKs, and the Connect services generated from e2b/envd's .proto files.
	"e2b":                                   HTTP,
	"e2b/envd":                              HTTP,
	"e2b/envd/filesystem":                   HTTP,
	"e2b/envd/filesystem/filesystemconnect": HTTP,
	"e2b/envd/process":                      HTTP,
	"e2b/envd/process/processconnect":       HTTP,
	"events":                                HTTP,
	// The client a proxy (the cluster router) names for a request, with its proof.
	"internal/forwarded": HTTP,
	"handlers":           HTTP,
	"metrics":            HTTP,
	"openapi":            HTTP,
	"openapi/stream":     HTTP,
	"openapi/client":     HTTP,
	"sdk/go/bothy":       HTTP,
	"server":             HTTP,
	// The registry client links net/http, which no package below the handlers may; the
	// image store knows it only as an image.Fetcher.
	"store/image/registry": HTTP,
	// Template generations pushed to and pulled from an OCI registry (docs/templates.md,
	// issue 43): a client of the registry like the image store's.
	"store/template/registry": HTTP,
	"web":                     HTTP,
	// Webhook deliveries link net/http; the checker knows their records only through the
	// check that cmd/bothyd hands it (check.Options.Webhooks).
	"webhook": HTTP,
	// The cluster's parts talk to the Kubernetes API server through client-go, which links
	// net/http (docs/cluster.md).
	"cluster/api/v1alpha1": HTTP,
	"cluster/audit":        HTTP,
	"cluster/config":       HTTP,
	"cluster/controller":   HTTP,
	"cluster/node":         HTTP,
	"cluster/placement":    HTTP,
	"cluster/router":       HTTP,
	// The egress proxy speaks HTTP to the hosts secrets are bound to; the network Manager
	// knows it only as a network.Egress, the checker only through cmd/bothyd
	// (check.Options.Egress).
	"egress": HTTP,

	"cmd/bothy":          Command,
	"cmd/bothyd":         Command,
	"cmd/bothyd-runtime": Command,
	"cmd/bothyload":      Command,

	"internal/layers": Tool,
	// The Helm chart's home in the module: its tests and the generator that copies the
	// CRDs and roles into it.
	"deploy/helm":     Tool,
	"deploy/helm/gen": Tool,
	// The control plane the cluster tests start (etcd and kube-apiserver); tests alone
	// import it.
	"internal/kubetest": Tool,
	"tests":             Tool,
	"tests/guest":       Tool,
}

// httpLibraries are the packages that make code an HTTP server or client; a package is one
// of them if its path is one of these or below one.
var httpLibraries = []string{"net/http", "github.com/go-chi/chi/v5", "github.com/gorilla/websocket"}

// seccompLibraries are what the host-side seccomp compiler (runtime/namespace/seccomp) builds
// on; the sandbox side receives a compiled filter and must not pay for their initialisers.
var seccompLibraries = []string{"github.com/moby/profiles/seccomp", "github.com/opencontainers/runtime-spec"}

func isHTTPLibrary(p Pkg) bool { return isLibrary(p, httpLibraries) }

// isLibrary reports whether p is outside the module and one of libs or below one.
func isLibrary(p Pkg, libs []string) bool {
	if p.Module {
		return false
	}
	for _, lib := range libs {
		if p.Path == lib || strings.HasPrefix(p.Path, lib+"/") {
			return true
		}
	}
	return false
}

// concreteRuntime returns the name of the concrete runtime a module-relative path belongs to
// ("namespace" for runtime/namespace and runtime/namespace/shim), or "" when it belongs to
// none; the runtime package itself is the interface, not a runtime.
func concreteRuntime(path string) string {
	rest, ok := strings.CutPrefix(path, "runtime/")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "/")
	return name
}

func classIn(classes ...Class) func(Pkg) bool {
	return func(p Pkg) bool {
		for _, c := range classes {
			if p.Class == c {
				return true
			}
		}
		return false
	}
}

// Rules are bothyd's import rules (see the package documentation). Direct rules over
// packages of the module hold transitively too, because every package of the module is
// classified and judged: a chain of allowed imports cannot end in a forbidden one without one
// of its links being forbidden. Rules about libraries outside the module walk the whole link
// set, since those libraries are not judged.
var Rules = []Rule{
	{
		Name: "sandbox-side",
		Why: "code that runs inside a sandbox or in bothyd-runtime imports only sandbox-side packages; " +
			"the stores, the supervisor, a runtime's host-side driver, the checker and the HTTP layer are host-side",
		Applies: classIn(Sandbox),
		Forbids: func(_, dep Pkg) bool { return dep.Module && dep.Class != Sandbox },
	},
	{
		Name:    "below-http",
		Why:     "the host-side packages below handlers (stores, supervisor, runtime driver, checker) do not depend on the HTTP layer",
		Applies: classIn(Host),
		Forbids: func(_, dep Pkg) bool { return dep.Module && dep.Class != Sandbox && dep.Class != Host },
	},
	{
		Name:       "no-http-below-handlers",
		Why:        "nothing below handlers links net/http, chi or gorilla/websocket: HTTP is the handlers' and the server's business",
		Applies:    classIn(Sandbox, Host),
		Transitive: true,
		Forbids:    func(_, dep Pkg) bool { return isHTTPLibrary(dep) },
	},
	{
		Name: "no-concrete-runtime",
		Why: "a concrete runtime (runtime/<name>/...) is imported only by its own packages and by the commands that wire it in; " +
			"everything else, the supervisor first, knows a runtime only through runtime.Runtime",
		Applies: func(from Pkg) bool { return from.Class != Command && from.Class != Tool },
		Forbids: func(from, dep Pkg) bool {
			name := concreteRuntime(dep.Path)
			return dep.Module && name != "" && name != concreteRuntime(from.Path)
		},
	},
	{
		Name:    "handlers-through-supervisor",
		Why:     "handlers talk to the supervisor alone: the stores, the runtime, the control protocol and the agent are reached through it, not imported",
		Applies: func(from Pkg) bool { return from.Path == "handlers" },
		Forbids: func(_, dep Pkg) bool {
			return dep.Module && slices.Contains([]string{"store", "store/template", "runtime", "control", "agent"}, dep.Path)
		},
	},
	{
		Name:    "tools-apart",
		Why:     "test and build tooling (tests, internal/layers) is imported by nothing: what the product links must not depend on it",
		Applies: func(Pkg) bool { return true },
		Forbids: func(_, dep Pkg) bool { return dep.Module && dep.Class == Tool },
	},
	{
		Name: "bothyd-runtime-links",
		Why: "bothyd-runtime runs the shim and init of every sandbox start: it links only sandbox-side packages " +
			"(no server, handlers, store, template store, supervisor, API, events, metrics, checker or seccomp compiler), " +
			"no HTTP library and not the seccomp profile libraries",
		Applies:    func(from Pkg) bool { return from.Path == "cmd/bothyd-runtime" },
		Transitive: true,
		Forbids: func(_, dep Pkg) bool {
			return (dep.Module && dep.Class != Sandbox) || isHTTPLibrary(dep) || isLibrary(dep, seccompLibraries)
		},
	},
}
