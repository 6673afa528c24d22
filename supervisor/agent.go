package supervisor

import (
	"context"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// runningAgent returns a control session with a running sandbox's agent, for file
// operations. It takes no lock: a session that a concurrent stop ends fails its operations,
// which is the right answer for them.
func (s *Supervisor) runningAgent(ctx context.Context, id string) (*control.Client, error) {
	c, cfg, err := s.usedAgent(ctx, id)
	if err == nil {
		s.use(cfg)() // a use of a moment: a file call, a process's look
	}
	return c, err
}

// usedAgent is [Supervisor.runningAgent] for a use: a sleeping sandbox whose policy says so
// is woken first (sleep.go). It returns the sandbox's configuration too, for the caller to
// record the use.
func (s *Supervisor) usedAgent(ctx context.Context, id string) (*control.Client, *Config, error) {
	cfg, err := s.wakeIfAsleep(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	c, err := s.plainAgent(ctx, id)
	if errcode.Of(err) == errcode.SandboxPaused {
		// Put to sleep between the wake and the look, or first known to sleep by the look's
		// reconciliation (a request before the start-up's reattach reached the sandbox):
		// wake it once more, if its policy says so.
		again, werr := s.wakeIfAsleep(ctx, id)
		if werr != nil {
			return nil, nil, werr
		}
		if again != nil && again.Sleep != nil && again.Sleep.AutoResume {
			cfg = again
			c, err = s.plainAgent(ctx, id)
		}
	}
	return c, cfg, err
}

// plainAgent returns the control session of running sandbox id, with no wake and no use.
func (s *Supervisor) plainAgent(ctx context.Context, id string) (*control.Client, error) {
	st, err := s.Status(id)
	if err != nil {
		return nil, err
	}
	if st.RuntimeMismatch {
		return nil, mismatchError(id)
	}
	if st.State == StatePaused {
		return nil, pausedError(id)
	}
	if st.State != StateRunning {
		return nil, errcode.New(errcode.NotRunning, "Sandbox %s is %s; start it first.", id, st.State)
	}
	rec, err := s.store.ReadRuntimeRecordUnlocked(id)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, errcode.New(errcode.NotRunning, "Sandbox %s is not running; start it first.", id)
	}
	dir, err := s.store.Dir(id)
	if err != nil {
		return nil, err
	}
	return s.agent(ctx, dir, id, rec)
}

// agent returns the cached session with the agent of rec's launch, or dials a new one (after
// a restart of bothyd, or when the last one died).
func (s *Supervisor) agent(ctx context.Context, dir, id string, rec *store.RuntimeRecord) (*control.Client, error) {
	s.mu.Lock()
	if c, ok := s.clients[id]; ok {
		select {
		case <-c.client.Done():
			delete(s.clients, id)
		default:
			if c.launchID == rec.LaunchID {
				s.mu.Unlock()
				return c.client, nil
			}
			delete(s.clients, id)
			c.client.Close()
		}
	}
	s.mu.Unlock()

	capability, err := readCapability(dir)
	if err != nil {
		return nil, err
	}
	rt, err := s.runtimeOfRecord(rec)
	if err != nil {
		return nil, err
	}
	client, err := s.dialAgent(ctx, rt.ControlPath(dir), capability, rec.Pid)
	if err != nil {
		// The runtime process lives (the caller checked) but its agent does not answer:
		// the sandbox is ending, or was ended from inside.
		return nil, errcode.Wrap(errcode.NotRunning, err,
			"Sandbox %s does not answer: its agent is gone and the sandbox is ending; start it again once it has stopped.", id)
	}
	s.keepClient(id, dir, rec.LaunchID, rt, client)
	return client, nil
}

// keepClient caches client, the session with the agent of launchID under rt, and tells it how
// to know its agent frozen.
func (s *Supervisor) keepClient(id, dir, launchID string, rt runtime.Runtime, client *control.Client) {
	client.SetFrozenCheck(func() bool { return agentFrozen(rt, id, dir, launchID) })
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.clients[id]; ok && old.client != client {
		old.client.Close()
	}
	s.clients[id] = &agentConn{launchID: launchID, client: client}
}

// agentFrozen reports whether the agent of launchID is frozen now, or may be: the sandbox
// is paused (its record says so; a microVM's pause stops its vCPUs), or the runtime reads its
// processes as frozen (a pause under way, a capture's freeze). A frozen agent answers
// nothing until it is thawed, which is no sign that it died.
func agentFrozen(rt runtime.Runtime, id, dir, launchID string) bool {
	if pausedLaunch(dir, launchID) {
		return true
	}
	p, ok := rt.(runtime.Pauser)
	if !ok || p.PauseSupport() != nil {
		return false
	}
	frozen, err := p.Frozen(id, dir)
	return err == nil && frozen
}

func (s *Supervisor) dropClient(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[id]; ok {
		c.client.Close()
		delete(s.clients, id)
	}
}

// Close stops the watchers and ends every control session (not the sandboxes: they outlive
// bothyd).
func (s *Supervisor) Close() {
	s.closeSpares()
	s.mu.Lock()
	s.closed = true
	for id, t := range s.timers {
		t.Stop()
		delete(s.timers, id)
	}
	for id, c := range s.clients {
		c.client.Close()
		delete(s.clients, id)
	}
	s.mu.Unlock()
	s.stopLife()
	s.wg.Wait()
}
