// Package layers enforces bothyd's import rules: which package may import which, read off
// the real import graph of the module's non-test code (`go list -deps -json ./...`), so that
// the layering in the architecture plan holds by test rather than by review.
//
// The package's own test (module_test.go) loads the module's graph for each platform the code
// builds for and fails on every violation of [Rules], naming the import chain that breaks the
// rule. [Check] is the checker itself; it knows nothing of bothyd and is tested on synthetic
// graphs, so that a violation demonstrably fails the test.
//
// # Every package is classified
//
// [Classes] puts each package of the module in one [Class]: [Sandbox], [Host], [HTTP],
// [Command] or [Tool]. The rules are written in terms of classes, and a package of the module
// that [Classes] does not name is itself a violation. A new package therefore cannot escape
// the rules by being new: whoever adds it decides where it stands, and the rules of that class
// apply from its first commit. An entry for a package that no longer exists is a violation
// too, so that the table stays a true map of the tree.
//
// # The rules
//
//   - Sandbox-side packages (what runs inside a sandbox, or in bothyd-runtime) import only
//     sandbox-side packages: never a store, the supervisor, the namespace driver, the checker
//     or the HTTP layer.
//   - Host-side packages below handlers (the stores, the supervisor, the namespace driver,
//     the checker) import no package of the HTTP layer, and nothing below handlers links
//     net/http, chi or gorilla/websocket, directly or through a library.
//   - A concrete runtime (a package under runtime/<name>/) is imported only by its own
//     packages and by the commands that wire it in; everything else, the supervisor first,
//     knows a runtime only through the runtime.Runtime interface.
//   - The handlers reach templates, the control protocol and the agent through the
//     supervisor, not directly.
//   - Nothing imports a [Tool] package (the end-to-end suite, this package).
//   - cmd/bothyd-runtime links only sandbox-side packages of the module (checked on its
//     whole link set, not just its imports), no HTTP library and not the seccomp profile
//     libraries that only the host-side compiler needs.
//
// Only non-test imports count: a test may import whatever it needs to set a scene.
//
// This package must not be imported by any other; it exists for its test.
package layers
