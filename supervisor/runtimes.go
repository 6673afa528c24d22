package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/network"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// A supervisor drives sandboxes of several runtime kinds. Each sandbox's configuration record
// names its kind (Config.Runtime, "" for records written before there was a choice: the
// default runtime's), each launch's runtime record names it again (RuntimeKind), and every
// call the supervisor makes for a sandbox goes to the runtime of that kind. Options.Runtime is
// the default; Options.Runtimes are the others.
//
// A kind may be known without being usable for new sandboxes: the operator turned it off, or
// this host cannot run it (Options.Unavailable), or its probe failed. Its existing sandboxes
// are still driven when the supervisor has its runtime (so that they can be stopped and
// deleted); a create is refused with unavailable and the reason. That holds for the default
// too: with it turned off, a create must name another runtime.

// Prober is a runtime that must find out at start-up whether, and how, it works here (the
// microvm runtime boots a probe guest to choose its accelerator). Probe answers the same each
// time once it has run; the first call may take seconds. AccelMode is the operator's choice
// that the probe follows ("auto" probes; "kvm", "tcg" are taken as given).
type Prober interface {
	Probe() (accelerator string, err error)
	AccelMode() string
}

// RuntimeState says whether a runtime can take new sandboxes.
type RuntimeState string

// The states of a runtime.
const (
	// RuntimeReady: sandboxes of this kind can be created.
	RuntimeReady RuntimeState = "ready"
	// RuntimeProbing: its start-up probe has not finished; a create waits for it.
	RuntimeProbing RuntimeState = "probing"
	// RuntimeUnavailable: it does not work here, or is turned off (Reason says which).
	RuntimeUnavailable RuntimeState = "unavailable"
)

// RuntimeStatus is one runtime kind as /v1/info shows it.
type RuntimeStatus struct {
	Kind string
	// Identity is the runtime identity, "" when the supervisor has no runtime of this kind.
	Identity string
	// Default says a create that names no runtime gets this one.
	Default bool
	State   RuntimeState
	// Accelerator is what runs its sandboxes ("kvm", "tcg"), "" for a runtime without one.
	Accelerator string
	// AccelMode is how the accelerator is chosen ("auto", "kvm", "tcg"), "" for a runtime
	// without one.
	AccelMode string
	// Reason says why it is unavailable.
	Reason string
	// Mechanisms are the kernel mechanisms it chose at start-up, nil for a runtime that
	// chooses none ([runtime.MechanismReporter]).
	Mechanisms *runtime.Mechanisms
}

// probeResult is a finished probe.
type probeResult struct {
	accel string
	err   error
}

// runtimeSet is the runtimes by kind, with what is known of their health.
type runtimeSet struct {
	byKind map[string]runtime.Runtime
	// order is the kinds, default first, then as given, then the unavailable ones by name.
	order []string
	// unavailable are the kinds refused on create, with why.
	unavailable map[string]error
	// probes are the finished probes by kind, under Supervisor.mu.
	probes map[string]probeResult
}

func newRuntimeSet(def runtime.Runtime, others []runtime.Runtime, unavailable map[string]error) (*runtimeSet, error) {
	rs := &runtimeSet{byKind: map[string]runtime.Runtime{}, unavailable: map[string]error{}, probes: map[string]probeResult{}}
	for _, rt := range append([]runtime.Runtime{def}, others...) {
		if rt == nil {
			return nil, errors.New("supervisor: a nil runtime")
		}
		if _, dup := rs.byKind[rt.Kind()]; dup {
			return nil, fmt.Errorf("supervisor: two runtimes of kind %q", rt.Kind())
		}
		rs.byKind[rt.Kind()] = rt
		rs.order = append(rs.order, rt.Kind())
	}
	var extra []string
	for kind, why := range unavailable {
		if why == nil {
			continue
		}
		rs.unavailable[kind] = why
		if _, ok := rs.byKind[kind]; !ok {
			extra = append(extra, kind)
		}
	}
	slices.Sort(extra)
	rs.order = append(rs.order, extra...)
	return rs, nil
}

// all returns every runtime the supervisor has, default first.
func (rs *runtimeSet) all() []runtime.Runtime {
	out := make([]runtime.Runtime, 0, len(rs.byKind))
	for _, k := range rs.order {
		if rt, ok := rs.byKind[k]; ok {
			out = append(out, rt)
		}
	}
	return out
}

// runtimeOf returns the runtime of kind ("" is the default's), or why there is none.
func (s *Supervisor) runtimeOf(kind string) (runtime.Runtime, error) {
	if kind == "" {
		return s.rt, nil
	}
	if rt, ok := s.runtimes.byKind[kind]; ok {
		return rt, nil
	}
	if why := s.runtimes.unavailable[kind]; why != nil {
		return nil, errcode.Wrap(errcode.Unavailable, why, "This server has no %s runtime (%v); use a bothyd that has one.", kind, why)
	}
	return nil, errcode.New(errcode.Unavailable, "This server has no %s runtime; use a bothyd that has one.", kind)
}

// runtimeFor returns the runtime of the sandbox that cfg configures.
func (s *Supervisor) runtimeFor(cfg *store.Config) (runtime.Runtime, error) {
	return s.runtimeOf(cfg.Runtime)
}

// runtimeOfRecord returns the runtime of a launch, by the kind its runtime record names.
func (s *Supervisor) runtimeOfRecord(rec *store.RuntimeRecord) (runtime.Runtime, error) {
	return s.runtimeOf(rec.RuntimeKind)
}

// lockedRuntime returns the runtime of the sandbox that l locks.
func (s *Supervisor) lockedRuntime(l *store.Lock) (runtime.Runtime, error) {
	cfg, err := l.Config()
	if err != nil {
		return nil, err
	}
	return s.runtimeFor(cfg)
}

// identityOf is the identity of the runtime of kind, "" when the supervisor has none: a live
// launch recorded under it is always a runtime-mismatch.
func (s *Supervisor) identityOf(kind string) string {
	rt, err := s.runtimeOf(kind)
	if err != nil {
		return ""
	}
	return rt.Identity()
}

// mismatched reports whether rec was recorded under another runtime identity than this
// supervisor's runtime of its kind.
func (s *Supervisor) mismatched(rec *store.RuntimeRecord) bool {
	id := s.identityOf(rec.RuntimeKind)
	return id == "" || rec.RuntimeID != id
}

// checkRuntime refuses a create of a sandbox of kind when that runtime cannot take one: it
// is unknown, turned off, or its probe found it cannot run here. A probe still running is
// no refusal: the runtime's Start waits for it.
func (s *Supervisor) checkRuntime(kind string) error {
	if kind == "" {
		kind = s.rt.Kind()
	}
	if why := s.runtimes.unavailable[kind]; why != nil {
		return errcode.Wrap(errcode.Unavailable, why, "The %s runtime is not available on this server: %v", kind, why)
	}
	if _, ok := s.runtimes.byKind[kind]; !ok {
		return errcode.Invalid("runtime", "There is no runtime %q; /v1/info lists the runtimes of this server.", kind)
	}
	s.mu.Lock()
	res, done := s.runtimes.probes[kind]
	s.mu.Unlock()
	if done && res.err != nil {
		return errcode.Wrap(errcode.Unavailable, res.err, "The %s runtime does not work on this host: %v", kind, res.err)
	}
	return nil
}

// ProbeRuntimes runs the start-up probe of every runtime that has one ([Prober]) and is not
// unavailable, each in the background: a probe may boot a guest for seconds, and bothyd
// serves meanwhile ([Supervisor.Runtimes] says probing). It returns at once.
func (s *Supervisor) ProbeRuntimes() {
	for _, rt := range s.runtimes.all() {
		p, ok := rt.(Prober)
		if !ok || s.runtimes.unavailable[rt.Kind()] != nil {
			continue
		}
		kind := rt.Kind()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			accel, err := p.Probe()
			if err != nil {
				s.log.Warn("runtime: does not work here", "runtime", kind, "err", err)
			} else {
				s.log.Info("runtime: ready", "runtime", kind, "accelerator", accel)
			}
			s.mu.Lock()
			s.runtimes.probes[kind] = probeResult{accel: accel, err: err}
			s.mu.Unlock()
		}()
	}
}

// Runtimes lists the runtime kinds of this supervisor, the default first, with whether each
// can take new sandboxes.
func (s *Supervisor) Runtimes() []RuntimeStatus {
	out := make([]RuntimeStatus, 0, len(s.runtimes.order))
	for _, kind := range s.runtimes.order {
		st := RuntimeStatus{Kind: kind, Default: kind == s.rt.Kind(), State: RuntimeReady}
		rt, have := s.runtimes.byKind[kind]
		if have {
			st.Identity = rt.Identity()
			if m, ok := rt.(runtime.MechanismReporter); ok {
				mech := m.Mechanisms()
				st.Mechanisms = &mech
			}
		}
		if why := s.runtimes.unavailable[kind]; why != nil {
			st.State, st.Reason = RuntimeUnavailable, why.Error()
			out = append(out, st)
			continue
		}
		if p, ok := rt.(Prober); ok {
			st.AccelMode = p.AccelMode()
			s.mu.Lock()
			res, done := s.runtimes.probes[kind]
			s.mu.Unlock()
			switch {
			case !done:
				st.State = RuntimeProbing
			case res.err != nil:
				st.State, st.Reason = RuntimeUnavailable, res.err.Error()
			default:
				st.Accelerator = res.accel
			}
		}
		out = append(out, st)
	}
	return out
}

// ownedProcess is a runtime process with the runtime that found it.
type ownedProcess struct {
	rt   runtime.Runtime
	proc runtime.Process
}

// allProcesses lists the live runtime processes of the state root of every runtime.
func (s *Supervisor) allProcesses() ([]ownedProcess, error) {
	var out []ownedProcess
	for _, rt := range s.runtimes.all() {
		found, err := rt.Processes(s.store.Root())
		if err != nil {
			return nil, fmt.Errorf("the %s runtime's processes: %w", rt.Kind(), err)
		}
		for _, p := range found {
			out = append(out, ownedProcess{rt: rt, proc: p})
		}
	}
	return out, nil
}

// launchProcesses are the runtime processes that a launch of the sandbox in dir may have
// left: proc (the launch's own, of rt, unless zero), and every shim of any runtime that names
// dir. Each comes with the runtime that must end it.
func (s *Supervisor) launchProcesses(rt runtime.Runtime, dir string, proc platform.ProcessID) ([]ownedProcess, error) {
	var out []ownedProcess
	if !proc.IsZero() {
		out = append(out, ownedProcess{rt: rt, proc: runtime.Process{ID: proc, Role: runtime.RoleShim, Dir: dir}})
	}
	found, err := s.allProcesses()
	if err != nil {
		return nil, err
	}
	for _, p := range found {
		if p.proc.Role == runtime.RoleShim && p.proc.Dir == dir && p.proc.ID != proc {
			out = append(out, p)
		}
	}
	return out, nil
}

// checkCreateRuntime refuses what a create asks of a runtime that it cannot give: a network
// for a runtime without network namespaces. A create that names no runtime gets the default
// (a clone its generation's), which provision checks as for every sandbox; a clone that names
// one must name its generation's (see [Supervisor.keyMismatch]).
func (s *Supervisor) checkCreateRuntime(req CreateRequest) error {
	if req.Runtime == "" {
		return nil
	}
	if err := s.checkRuntime(req.Runtime); err != nil {
		return err
	}
	rules, err := s.parseNetwork(req.Network)
	if err != nil {
		return err
	}
	return s.checkNetworkRuntime(req.Runtime, rules)
}

// checkNetworkRuntime refuses a networked policy for a sandbox of a runtime kind that cannot
// give it an interface.
func (s *Supervisor) checkNetworkRuntime(kind string, rules *network.Rules) error {
	if !rules.Networked() {
		return nil
	}
	rt, err := s.runtimeOf(kind)
	if err != nil {
		return err
	}
	if _, ok := rt.(runtime.NetNSer); !ok {
		return errcode.New(errcode.Unavailable, "The %s runtime cannot give a sandbox a network interface yet; leave out network.", rt.Kind())
	}
	return nil
}

// sandboxRuntime is the runtime of sandbox id as its configuration names it, read without
// its lock (for a check before the lock is taken), or the default runtime when the sandbox
// does not read: the lock's own look then answers for a missing sandbox.
func (s *Supervisor) sandboxRuntime(id string) (runtime.Runtime, error) {
	cfg, err := s.store.ReadConfigUnlocked(id)
	if err != nil || cfg == nil {
		return s.rt, nil //nolint:nilerr // the caller's lockProvisioned reports it
	}
	return s.runtimeFor(cfg)
}

// sandboxPauser is the Pauser of sandbox id's runtime (see [Supervisor.sandboxRuntime]).
func (s *Supervisor) sandboxPauser(id string) (runtime.Pauser, error) {
	rt, err := s.sandboxRuntime(id)
	if err != nil {
		return nil, err
	}
	return pauserOf(rt)
}

// kindOf is the runtime kind of the sandbox that cfg configures.
func (s *Supervisor) kindOf(cfg *store.Config) string {
	if cfg.Runtime == "" {
		return s.rt.Kind()
	}
	return cfg.Runtime
}

// Usage reads what running (or paused) sandbox id has used, from its runtime ([runtime.Meter]),
// with its status as read just before. It takes no lock: a reading is a look at the host, and
// a sandbox that ends meanwhile answers not-running.
func (s *Supervisor) Usage(id string) (*Status, runtime.Usage, error) {
	st, err := s.Status(id)
	if err != nil {
		return nil, runtime.Usage{}, err
	}
	if st.State != StateRunning && st.State != StatePaused {
		return st, runtime.Usage{}, errcode.New(errcode.NotRunning, "Sandbox %s is %s: only a running sandbox has usage to read; start it first.", id, st.State)
	}
	rt, err := s.runtimeFor(&st.Config)
	if err != nil {
		return st, runtime.Usage{}, err
	}
	m, ok := rt.(runtime.Meter)
	if !ok {
		return st, runtime.Usage{}, errcode.New(errcode.Unavailable, "The %s runtime does not measure its sandboxes' usage.", rt.Kind())
	}
	dir, err := s.store.Dir(id)
	if err != nil {
		return st, runtime.Usage{}, err
	}
	u, err := m.Usage(id, dir)
	if errors.Is(err, fs.ErrNotExist) {
		return st, u, errcode.Wrap(errcode.NotRunning, err, "Sandbox %s ended as its usage was read.", id)
	}
	return st, u, err
}
