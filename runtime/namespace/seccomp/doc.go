// Package seccomp compiles seccomp profiles (the OCI form, as Docker's default profile comes)
// into classic BPF programs for the native architecture. It is the host side of the namespace
// runtime's system call filter: namespace.New (package runtime/namespace) compiles the sandboxes' filter once with
// [Default], and the shim and init receive it in its binary form and install it with
// [platform.SeccompProgram], which needs no profile library.
//
// Only host-side packages may import it: it links github.com/moby/profiles/seccomp and
// github.com/opencontainers/runtime-spec, which the sandbox side (cmd/bothyd-runtime) must
// not carry.
//
// A compiled program checks the architecture first (a call by another ABI, i386 or x32 on
// x86-64, gets the default action, since it would bypass every rule by number), then finds
// the call's number by a binary search over runs of numbers treated alike, and for a number
// whose rules have conditions tests them in the profile's order, the default action last
// (see [Compile] for why a search). System call names that the native architecture lacks
// are skipped; the tables of names come from golang.org/x/sys (gen.go).
package seccomp
