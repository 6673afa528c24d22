package main

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm"
	"github.com/bothy/bothy/runtime/namespace"
)

// runtimeKinds are the runtimes bothyd has, the default first.
var runtimeKinds = []string{namespace.Kind, microvm.Kind}

// runtimeSet is what the server runs sandboxes with: the default runtime (namespace), the
// others it could build, and the kinds that take no new sandboxes, with why.
type runtimeSet struct {
	def         *namespace.Runtime
	others      []runtime.Runtime
	unavailable map[string]error
	exe         string
}

// parseRuntimes reads the --runtimes flag: "" is every runtime that works here; otherwise a
// comma-separated list of kinds, each to be enabled.
func parseRuntimes(list string) (kinds []string, explicit bool, err error) {
	if strings.TrimSpace(list) == "" {
		return runtimeKinds, false, nil
	}
	for k := range strings.SplitSeq(list, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(runtimeKinds, k) {
			return nil, false, fmt.Errorf("--runtimes: unknown runtime %q; want a list of %s", k, strings.Join(runtimeKinds, ", "))
		}
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	return kinds, true, nil
}

// errTurnedOff is why a runtime left out of --runtimes takes no new sandboxes.
var errTurnedOff = errors.New("turned off by the operator (--runtimes)")

// newRuntimes makes the runtimes as the server configures them (see newRuntime for the
// executable; `bothyd check` makes them here too, so that it knows every runtime's
// processes and identity). The namespace runtime is always made, the default, so that its
// sandboxes can be driven even with it turned off. The microvm runtime is made only where
// QEMU and the guest kernel are (else it is listed unavailable, with what is missing); turned
// off, it is still made where it could run, to drive the microVMs that run already. A runtime
// the operator named that cannot run here is an error.
func newRuntimes(o runtimeOptions, root string, log *slog.Logger) (*runtimeSet, error) {
	list := o.runtimes
	kinds, explicit, err := parseRuntimes(list)
	if err != nil {
		return nil, err
	}
	def, exe, err := newRuntime(o, root, log)
	if err != nil {
		return nil, err
	}
	set := &runtimeSet{def: def, exe: exe, unavailable: map[string]error{}}
	if !slices.Contains(kinds, namespace.Kind) {
		set.unavailable[namespace.Kind] = errTurnedOff
	}
	vm, err := microvm.New(microvm.Config{Executable: exe, Accel: o.microvmAccel, CgroupParent: o.cgroupParent})
	if err != nil {
		return nil, err
	}
	wanted := slices.Contains(kinds, microvm.Kind)
	switch why := vm.Refusal(); {
	case why != nil && wanted && explicit:
		return nil, fmt.Errorf("--runtimes %s: %w", list, why)
	case why != nil:
		set.unavailable[microvm.Kind] = why
	default:
		set.others = append(set.others, vm)
		if !wanted {
			set.unavailable[microvm.Kind] = errTurnedOff
		}
	}
	if len(set.unavailable) == len(runtimeKinds) {
		return nil, fmt.Errorf("--runtimes %q leaves no runtime that works here", list)
	}
	// A kernel that cannot run namespace sandboxes is found by the runtime's probes: the
	// server still starts (to drive the sandboxes it has, serve its templates and its API,
	// and run microVMs), and every create of a namespace sandbox is refused at once with the
	// probe's reason, which /v1/info shows too.
	if why := def.KernelRefusal(); why != nil && set.unavailable[namespace.Kind] == nil {
		set.unavailable[namespace.Kind] = why
	}
	return set, nil
}
