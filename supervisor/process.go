package supervisor

import "context"

// StartProcess starts a workload in a running sandbox without exec admission: it takes no
// exec lock, so any number of them run at once, beside an admitted exec, and the exec lock's
// one-at-a-time admission ([Supervisor.AdmitExec], sandbox-busy) is untouched by them. It is
// the E2B compatibility surface's process model (docs/e2b.md), whose caller tracks the
// workloads it starts. Like [Supervisor.StartExec] the workload runs until it exits, its
// timeout passes or Close kills it; ctx bounds only the start. A paused or stopped sandbox
// refuses it as the file operations do.
func (s *Supervisor) StartProcess(ctx context.Context, id string, req ExecRequest) (*Session, error) {
	st, err := s.Status(id)
	if err != nil {
		return nil, err
	}
	agent, err := s.runningAgent(ctx, id)
	if err != nil {
		return nil, err
	}
	// An admission without a lock: Release is a no-op on it, and lost() still explains a
	// workload whose sandbox stopped under it.
	a := &Admission{id: id, agent: agent, defaults: s.execDefaultsOf(st.Config.Image)}
	return s.StartExec(ctx, a, req)
}

// PID is the workload's pid inside the sandbox.
func (x *Session) PID() int { return x.proc.PID }
