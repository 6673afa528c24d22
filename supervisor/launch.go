package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// requiredFeatures are what the server needs of an agent before a launch commits.
var requiredFeatures = []string{"exec", "files", "shutdown"}

// Start launches a provisioned sandbox. ctx's deadline bounds the wait for the lock and the
// wait for the agent.
func (s *Supervisor) Start(ctx context.Context, id string) (_ *Status, err error) {
	defer s.observe("start", time.Now(), &err)
	// Admitted before the lock: the admission reads every sandbox's status, this one's too,
	// which at start-up may wait for its lock.
	release, err := s.admitStart(id)
	if err != nil {
		return nil, err
	}
	defer release()
	l, _, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(l)
	return s.startLocked(ctx, l)
}

// admitStart asks the admission, if any, for room for a start of a sandbox that holds none
// now (stopped, or only provisioned): a start takes its memory and CPU limits, as a create
// with start does. A sandbox in any other state is left to startLocked's own answer.
func (s *Supervisor) admitStart(id string) (release func(), err error) {
	if s.admission == nil {
		return func() {}, nil
	}
	st, err := s.Status(id)
	if err != nil || (st.State != StateStopped && st.State != StateProvisioned) {
		return func() {}, nil //nolint:nilerr // the start reads the sandbox again and answers
	}
	return s.admission.Admit(id, st.Config.Resources)
}

// startLocked starts the sandbox that l locks.
func (s *Supervisor) startLocked(ctx context.Context, l *store.Lock) (*Status, error) {
	id := l.ID()
	cfg, err := l.Config()
	if err != nil {
		return nil, err
	}
	r, err := s.reattach(ctx, l)
	if err != nil {
		return nil, err
	}
	switch {
	case r.mismatch:
		return nil, mismatchError(id)
	case r.state == StateRunning:
		return nil, errcode.New(errcode.AlreadyRunning, "Sandbox %s is already running.", id)
	}
	lowers, err := s.sandboxLowers(l, cfg)
	if err != nil {
		return nil, err
	}
	s.setTransient(id, StateStarting)
	defer s.setTransient(id, "")
	if err := s.launch(ctx, l, cfg, lowers); err != nil {
		return nil, err
	}
	s.setTransient(id, "")
	s.emit(Event{Type: EventStarted, Sandbox: id, State: StateRunning})
	return s.status(id, true)
}

// launch runs the launch protocol (see the package doc) under l.
func (s *Supervisor) launch(ctx context.Context, l *store.Lock, cfg *store.Config, lowers []string) error {
	rt, err := s.runtimeFor(cfg)
	if err != nil {
		return err
	}
	img, err := s.stackImage(l.Dir(), cfg)
	if err != nil {
		return err
	}
	restore, err := s.restoreFor(l, cfg)
	if err != nil {
		return err
	}
	// A restore has its generation's NIC, whatever the policy: a networked restore of a
	// generation without one is refused here, before anything of the launch is made.
	restoredNIC := false
	if restore != nil && len(lowers) > 0 {
		if restoredNIC, err = s.restoreNIC(rt, cfg, lowers[0]); err != nil {
			return err
		}
	}
	// No process of an earlier launch can run now (reattach made sure), so staging leftovers
	// of its outcome report are garbage.
	if err := l.CleanStaging(); err != nil {
		return err
	}
	launchID := naming.RandomHex(8)
	capability := []byte(naming.RandomHex(32))
	// Atomic but not synced: the capability is read only to dial this launch's agent while
	// it runs. A crash of bothyd keeps the page cache, so the next bothyd reads it whole;
	// a crash of the host ends the launch (its records name the old boot), so whatever the
	// file then holds is never used, and the next launch writes a new one. Two fsyncs less
	// per start.
	if err := platform.WriteFileAtomic(l.Dir(), CapabilityName, capability, 0o600); err != nil {
		return errcode.Storage(fmt.Errorf("writing the control capability: %w", err), s.store.Root())
	}
	journal := &store.LaunchJournal{
		Format:    store.LaunchFormat,
		LaunchID:  launchID,
		RuntimeID: rt.Identity(),
		StartedAt: time.Now().UTC(),
	}
	if err := l.WriteLaunchJournal(journal); err != nil {
		return err
	}
	s.crash("journaled")
	vols, err := s.launchVolumes(rt, cfg.Volumes)
	if err != nil {
		s.abandon(ctx, l, launchID, platform.ProcessID{}, runtime.ReasonStartFailed)
		return err
	}
	spec := runtime.Spec{
		ID:       cfg.ID,
		Dir:      l.Dir(),
		LaunchID: launchID,
		Image:    cfg.Image,
		ImageDir: img.dir,
		HostBase: s.HostBase(),
		Lowers:   append(slices.Clone(lowers), img.lowers...),
		Resources: runtime.Resources{
			VCPUs: cfg.Resources.VCPUs, MemoryMB: cfg.Resources.MemoryMB, Pids: cfg.Resources.Pids,
		},
		DiskMB:     cfg.DiskMB,
		Env:        s.secretEnv(cfg, img.env(cfg.Env)),
		Capability: capability,
		Hostname:   cfg.ID,
		Network:    s.net.mgr != nil && s.rulesOf(cfg).Networked(),
		Restore:    restore,
		Volumes:    vols,
	}
	proc, err := rt.Start(ctx, spec)
	if err != nil {
		s.abandon(ctx, l, launchID, platform.ProcessID{}, runtime.ReasonStartFailed)
		if ctx.Err() != nil {
			return errcode.Wrap(errcode.StartTimeout, err, "Sandbox %s did not start within its deadline; retry with a longer timeout.", cfg.ID)
		}
		return s.startErr(fmt.Errorf("starting the runtime: %w", err))
	}
	s.crash("spawned")
	// Name the process in the journal, so that a crash from here on leaves an interrupted
	// start whose process the next transition can end by identity.
	journal.Pid, journal.PidStartTime, journal.BootID = proc.Pid, proc.StartTime, proc.BootID
	if err := l.WriteLaunchJournal(journal); err != nil {
		s.abandon(ctx, l, launchID, proc, runtime.ReasonStartFailed)
		return err
	}
	s.crash("named")
	client, err := s.awaitAgent(ctx, rt.ControlPath(l.Dir()), capability, proc)
	if err != nil {
		s.abandon(ctx, l, launchID, proc, runtime.ReasonStartFailed)
		return errcode.Wrap(errcode.StartTimeout, err,
			"Sandbox %s did not come up: %v. The end of its log:\n%s", cfg.ID, err, s.logTail(l.Dir(), 20))
	}
	if restore != nil {
		if err := restored(l.Dir()); err != nil {
			client.Close()
			s.abandon(ctx, l, launchID, proc, runtime.ReasonStartFailed)
			return err
		}
		s.crash("restored")
		if restoredNIC && !s.networked(cfg) {
			if err := s.dropRestoredNetwork(ctx, cfg, client); err != nil {
				client.Close()
				s.abandon(ctx, l, launchID, proc, runtime.ReasonStartFailed)
				return err
			}
		}
	}
	if err := s.attachLaunchNetwork(ctx, l, cfg, proc, client); err != nil {
		client.Close()
		s.abandon(ctx, l, launchID, proc, runtime.ReasonStartFailed)
		return err
	}
	rec := &store.RuntimeRecord{
		Format:        store.RuntimeFormat,
		LaunchID:      launchID,
		RuntimeKind:   rt.Kind(),
		RuntimeID:     rt.Identity(),
		Pid:           proc.Pid,
		PidStartTime:  proc.StartTime,
		BootID:        proc.BootID,
		ControlSocket: rt.ControlPath(l.Dir()),
		StartedAt:     journal.StartedAt,
	}
	if err := l.WriteRuntimeRecord(rec); err != nil {
		client.Close()
		s.abandon(ctx, l, launchID, proc, runtime.ReasonStartFailed)
		return err
	}
	s.crash("recorded")
	if err := l.RemoveCommittedLaunchJournal(); err != nil {
		// The runtime record is durable, so the launch has committed: reattach removes a
		// journal that a runtime record of the same launch supersedes.
		s.log.Warn("removing the launch journal after commit", "sandbox", cfg.ID, "err", err)
	}
	s.keepClient(cfg.ID, l.Dir(), launchID, rt, client)
	s.watch(cfg.ID, rec)
	return nil
}

// awaitAgent dials the control socket at path until the agent answers hello with the
// features the server needs, the runtime process exits, or ctx ends.
func (s *Supervisor) awaitAgent(ctx context.Context, path string, capability []byte, proc platform.ProcessID) (*control.Client, error) {
	// The agent renames its socket into place once it accepts connections, a few
	// milliseconds after the start: a failed dial costs a syscall, so look every
	// millisecond rather than back off and answer late.
	const poll = time.Millisecond
	for {
		client, err := s.dialAgent(ctx, path, capability, proc.Pid)
		if err == nil {
			return client, nil
		}
		if !proc.Alive() {
			return nil, errors.New("the sandbox exited before its agent answered")
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("its agent did not answer in time (last error: %v)", err)
		case <-time.After(poll):
		}
	}
}

// dialAgent connects to an agent's control socket and says hello, once the socket is known
// to be the one the runtime process shimPid listens on: reached without following a link,
// and with that process as its peer (SO_PEERCRED names the process that listened).
func (s *Supervisor) dialAgent(ctx context.Context, path string, capability []byte, shimPid int) (*control.Client, error) {
	conn, err := platform.DialUnixNoFollow(ctx, path)
	if err != nil {
		return nil, err
	}
	pid, uid, _, err := platform.PeerCred(conn)
	if err != nil || pid != shimPid || uid != os.Geteuid() {
		conn.Close()
		return nil, fmt.Errorf("the control socket's listener is pid %d uid %d (%v), not the sandbox's runtime process %d", pid, uid, err, shimPid)
	}
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	client, err := control.Dial(conn, capability, timeout)
	if err != nil {
		return nil, err
	}
	for _, f := range requiredFeatures {
		if !slices.Contains(client.Features(), f) {
			client.Close()
			return nil, fmt.Errorf("the agent lacks the %q feature", f)
		}
	}
	return client, nil
}

// abandon undoes a launch that did not commit: it ends the runtime process if there is one,
// releases what the runtime left, records the outcome and removes the journal. It runs even
// after the caller's deadline passed.
func (s *Supervisor) abandon(ctx context.Context, l *store.Lock, launchID string, proc platform.ProcessID, reason runtime.Reason) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := s.endLaunch(cctx, l, proc); err != nil {
		s.log.Error("abandoning a launch", "sandbox", l.ID(), "launch", launchID, "err", err)
		return // keep the journal: the next transition retries
	}
	_ = runtime.WriteOutcome(l.Dir(), &runtime.Outcome{
		Format: runtime.OutcomeFormat, LaunchID: launchID, Reason: reason, ExitCode: -1, At: time.Now().UTC(),
	})
	if err := l.RemoveLaunchJournal(); err != nil {
		s.log.Error("removing the launch journal of an abandoned launch", "sandbox", l.ID(), "err", err)
	}
}

// endLaunch kills a launch's runtime process (by verified identity, and any other runtime
// process, of any runtime, that names this state directory) and cleans up after it: each
// process through the runtime that owns it, and the sandbox's runtime at least once.
func (s *Supervisor) endLaunch(ctx context.Context, l *store.Lock, proc platform.ProcessID) error {
	rt, err := s.lockedRuntime(l)
	if err != nil {
		return err
	}
	procs, err := s.launchProcesses(rt, l.Dir(), proc)
	if err != nil {
		return err
	}
	for _, p := range procs {
		if err := p.rt.Kill(ctx, l.Dir(), p.proc.ID); err != nil {
			return err
		}
	}
	if !slices.ContainsFunc(procs, func(p ownedProcess) bool { return p.rt == rt }) {
		procs = append(procs, ownedProcess{rt: rt})
	}
	for _, p := range procs {
		if err := p.rt.Cleanup(ctx, l.ID(), l.Dir(), p.proc.ID); err != nil {
			return err
		}
	}
	s.detachNetwork(l.ID())
	return l.CleanStaging()
}

// readCapability reads a launch's control capability.
func readCapability(dir string) ([]byte, error) {
	b, err := platform.ReadFile(filepath.Join(dir, CapabilityName), 4096)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errors.New("the control capability is missing")
	}
	return b, err
}
