package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/store"
)

// Admission is an admitted exec: it holds the sandbox's exec lock until Release. Its workload
// is started with [Supervisor.RunExec] or [Supervisor.StartExec].
type Admission struct {
	// Waited is how long admission took.
	Waited time.Duration
	id     string
	agent  *control.Client // the control session to run the workload on
	// defaults are the image's defaults of every exec.
	defaults execDefaults
	lock     *os.File
	// inUse ends the exec's use of a sandbox that may sleep (sleep.go).
	inUse func()
}

// Release gives the exec lock back. It is idempotent.
func (a *Admission) Release() {
	if a.inUse != nil {
		a.inUse()
	}
	if a.lock != nil {
		_ = platform.Unlock(a.lock)
		a.lock.Close()
		a.lock = nil
	}
}

// AdmitExec admits one exec into a running sandbox (see "Exec admission" in the package doc).
// wait bounds the whole admission: the lifecycle lock and the exec lock.
func (s *Supervisor) AdmitExec(ctx context.Context, id string, wait time.Duration) (_ *Admission, err error) {
	defer s.observe("exec-admission", time.Now(), &err)
	if wait <= 0 {
		return nil, errcode.Invalid("wait_ms", "The admission wait must be positive.")
	}
	// A sleeping sandbox is woken before the admission, which waits for no wake; one put to
	// sleep between the wake and the admission is woken once more.
	a, err := s.admitExec(ctx, id, wait)
	if errcode.Of(err) == errcode.SandboxPaused {
		if cfg, werr := s.wakeIfAsleep(ctx, id); werr != nil {
			return nil, werr
		} else if cfg != nil && cfg.Sleep != nil && cfg.Sleep.AutoResume {
			a, err = s.admitExec(ctx, id, wait)
		}
	}
	return a, err
}

// admitExec is one [Supervisor.AdmitExec]: a wake if the sandbox sleeps, then the admission.
func (s *Supervisor) admitExec(ctx context.Context, id string, wait time.Duration) (*Admission, error) {
	cfg, err := s.wakeIfAsleep(ctx, id)
	if err != nil {
		return nil, err
	}
	// The use begins before the admission takes the lifecycle lock: a sleep that takes the
	// lock after it sees the use and leaves the sandbox awake ([Supervisor.pause]), and one
	// that took it before leaves it paused for this admission to see (sandbox-paused).
	inUse := s.use(cfg)
	a, err := s.admitOnce(ctx, id, wait)
	if err != nil {
		inUse()
		return nil, err
	}
	a.inUse = inUse
	return a, nil
}

// admitOnce waits for the admission of one exec, up to wait.
func (s *Supervisor) admitOnce(ctx context.Context, id string, wait time.Duration) (*Admission, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var a *Admission
	err := store.Retry(ctx, func() error {
		return errcode.New(errcode.SandboxBusy,
			"Another exec is running in sandbox %s and did not end within %s; retry later or raise wait_ms.", id, wait)
	}, func() (store.Attempt, error) {
		got, busy, err := s.tryAdmit(ctx, id)
		if got != nil {
			got.Waited = time.Since(start)
			a = got
		}
		switch {
		case err != nil:
			return store.Failed, err
		case busy:
			return store.Busy, nil
		}
		return store.Acquired, nil
	})
	return a, err
}

// tryAdmit makes one attempt under the lifecycle lock; busy says the exec lock was taken.
func (s *Supervisor) tryAdmit(ctx context.Context, id string) (a *Admission, busy bool, err error) {
	l, cfg, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, false, err
	}
	defer s.unlock(l)
	r, err := s.reattach(ctx, l)
	if err != nil {
		return nil, false, err
	}
	switch {
	case r.mismatch:
		return nil, false, mismatchError(id)
	case r.state != StateRunning:
		return nil, false, errcode.New(errcode.NotRunning, "Sandbox %s is not running; start it first.", id)
	case r.paused:
		return nil, false, pausedError(id)
	}
	rec := r.rec
	f, err := platform.OpenFile(filepath.Join(l.Dir(), ExecLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	ok, err := platform.TryLock(f)
	if err != nil || !ok {
		f.Close()
		return nil, err == nil, err
	}
	// Admitted: the dial is the exec's, not the admission wait's, so a wait that ends during
	// it must not fail the exec.
	dctx, cancel := cleanupContext(ctx)
	client, err := s.agent(dctx, l.Dir(), id, rec)
	cancel()
	if err != nil {
		_ = platform.Unlock(f)
		f.Close()
		return nil, false, err
	}
	return &Admission{id: id, agent: client, lock: f, defaults: s.execDefaultsOf(cfg.Image)}, false, nil
}
