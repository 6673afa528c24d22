package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/store"
)

// PendingName marks a sandbox whose create asked for a start that has not yet succeeded: if
// bothyd crashes before the start commits, the next start-up ([Supervisor.ReattachAll])
// removes the sandbox, so that a create with start is all or nothing across crashes too
// (but for the window that [Supervisor.prepare] describes).
const PendingName = "create.pending"

// CreateRequest is a new sandbox: provisioned from an image, or cloned from a template
// generation when Clone is set.
type CreateRequest struct {
	ID string
	// Image is the image to provision from; "" means HostImage. A clone takes its
	// generation's (see CloneRequest.Image).
	Image string
	// Resources are the sandbox's limits. A clone takes its generation's (see
	// CloneRequest.Resources).
	Resources Resources
	// DiskMB is the size of the sandbox's own disk; 0 means none. A clone's disk is its own.
	DiskMB int
	Env    map[string]string
	Labels map[string]string
	// Network is the egress policy; nil means no interface but lo.
	Network *NetworkPolicy
	// Clone, when set, names the generation to clone from.
	Clone *CloneRequest
	// Start also starts the sandbox. The create is then all or nothing: a start that fails
	// removes the sandbox again (and releases a clone's lease), and the start's error comes
	// back.
	Start bool
	// Lifetime, when set, bounds how long the sandbox lives (see [Lifetime]).
	Lifetime *Lifetime
	// Runtime is the kind of runtime to run the sandbox under; "" means the default one
	// (see [Supervisor.Runtimes]).
	Runtime string
	// AnyID says the server chose ID (see [NewSandboxID]): a create with start that asks for
	// nothing but the defaults may then be given a spare, and its id (spares.go).
	AnyID bool
	// Sleep, when set, lets the sandbox sleep when idle and wake on use (sleep.go).
	Sleep *SleepPolicy
	// Volumes are the volumes to mount (volumes.go); a clone names its own.
	Volumes []VolumeMount

	// spare makes the sandbox a spare.
	spare bool
}

// Create provisions a sandbox, or clones one (see [Supervisor.Provision] and
// [Supervisor.Clone]), and with req.Start starts it.
func (s *Supervisor) Create(ctx context.Context, req CreateRequest) (*Status, error) {
	if err := checkLifetime(req.Lifetime); err != nil {
		return nil, err
	}
	// Admitted before a spare is claimed, which is a create like any other for the node's
	// limits; a clone is admitted once its generation's limits are known (clone). A spare
	// itself is the server's, not a client's: no admission, and no refusal while draining.
	hold := &admissionHold{id: req.ID, slotOnly: !req.Start}
	if !req.spare {
		hold.admission = s.admission
	}
	// Held until the create has returned, its start included (a clone starts below).
	defer hold.release()
	if req.Clone == nil {
		if err := hold.admit(req.Resources); err != nil {
			return nil, err
		}
	}
	if st := s.claimSpare(ctx, req); st != nil {
		return st, nil
	}
	cfg := Config{
		ID:        req.ID,
		Image:     req.Image,
		Resources: req.Resources,
		DiskMB:    req.DiskMB,
		Env:       req.Env,
		Labels:    req.Labels,
		Network:   req.Network,
		Runtime:   req.Runtime,
		Sleep:     req.Sleep,
		Volumes:   req.Volumes,
	}
	if err := s.checkVolumes(req); err != nil {
		return nil, err
	}
	if err := checkSleep(req.Sleep); err != nil {
		return nil, err
	}
	if err := s.checkNetwork(req.Network); err != nil {
		return nil, err
	}
	if err := s.checkCreateRuntime(req); err != nil {
		return nil, err
	}
	p := provisioning{pending: req.Start, lifetime: req.Lifetime, spare: req.spare, admission: hold}
	if req.Clone != nil {
		if req.Clone.Runtime == "" {
			req.Clone.Runtime = req.Runtime
		}
		st, err := s.clone(ctx, cfg, *req.Clone, p)
		if err != nil || !req.Start {
			return st, err
		}
		// The clone's lock was released with the template store's (a launch must not hold
		// the template store's lock); lock the clone again to start it.
		l, _, err := s.lockProvisioned(ctx, req.ID)
		if err != nil {
			return nil, err
		}
		st, err = s.startCreated(ctx, l)
		if err == nil {
			s.armLifetime(req.ID)
		}
		return st, err
	}
	if !req.Start {
		return s.provision(ctx, cfg, p, nil)
	}
	var st *Status
	_, err := s.provision(ctx, cfg, p, func(l *store.Lock) (err error) {
		st, err = s.startCreated(ctx, l)
		return err
	})
	return st, err
}

// provisioning is what a create adds to a plain provision.
type provisioning struct {
	// pending writes PendingName before the configuration record.
	pending  bool
	lifetime *Lifetime
	// spare marks the sandbox a spare in its configuration record.
	spare bool
	// admission, set by a create of a clone, admits the sandbox once its generation's limits
	// are known; the create releases it when it returns. Nil: admitted.
	admission *admissionHold
}

// admissionHold is one create's admission: what it reserved, until the create returns.
type admissionHold struct {
	admission CreateAdmission
	id        string
	// slotOnly: the create does not start the sandbox, which then holds no memory or CPU.
	slotOnly bool
	released func()
}

// admit asks the create's admission, if any (a nil hold has none), for room for a sandbox
// with these limits; a hold admits once.
func (h *admissionHold) admit(limits Resources) error {
	if h == nil || h.admission == nil || h.released != nil {
		return nil
	}
	if h.slotOnly {
		limits = Resources{}
	}
	release, err := h.admission.Admit(h.id, limits)
	if err != nil {
		return err
	}
	h.released = release
	return nil
}

// release gives back what admit reserved.
func (h *admissionHold) release() {
	if h.released != nil {
		h.released()
		h.released = nil
	}
}

// prepare writes what p asks for into the state directory l locks, right after the
// configuration record that makes the sandbox exist: before it, a crash would leave a
// directory with more in it than an interrupted provision leaves, which neither the store nor
// bothyd check would then remove. A crash between the two writes leaves a sandbox as a plain
// create makes it (provisioned, without a lifetime or the mark); that window is one durable
// write long.
func (s *Supervisor) prepare(l *store.Lock, p provisioning) error {
	if p.pending {
		if err := platform.WriteFileDurable(l.Dir(), PendingName, []byte("start\n"), 0o600); err != nil {
			return err
		}
	}
	if p.lifetime != nil {
		if err := writeDeadline(l.Dir(), newDeadline(*p.lifetime, time.Now())); err != nil {
			return err
		}
	}
	return nil
}

// undoProvision removes a sandbox whose provision could not write all it needed.
func (s *Supervisor) undoProvision(ctx context.Context, l *store.Lock) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if err := l.Deprovision(cctx); err != nil {
		s.log.Error("undoing a provision that failed half-way", "sandbox", l.ID(), "err", err)
	}
}

// startCreated starts the sandbox that a create with start made, under l, and releases l.
// On failure it removes the sandbox under the same lock.
func (s *Supervisor) startCreated(ctx context.Context, l *store.Lock) (_ *Status, err error) {
	id := l.ID()
	// The start is a transition of its own for the metrics, as a separate Start would be.
	st, err := s.observedStart(ctx, l)
	if errcode.Of(err) == errcode.AlreadyRunning {
		// Only a clone can get here (another client started it between the clone and this
		// start): the sandbox exists and runs, as the create asked.
		err = nil
		st, _ = s.status(id, true)
	}
	if err == nil {
		if rerr := removePending(l.Dir()); rerr != nil {
			s.log.Warn("removing the create's pending mark", "sandbox", id, "err", rerr)
		}
		s.unlock(l)
		if st == nil {
			return s.status(id, true)
		}
		return st, nil
	}
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	if derr := s.deprovisionLocked(cctx, l); derr != nil {
		s.log.Error("undoing a create whose start failed; the next start-up of bothyd removes it", "sandbox", id, "err", derr)
	}
	return nil, err
}

// removePending removes PendingName durably.
func removePending(dir string) error { return removeOwnRecord(dir, PendingName) }

// hasPending reports whether the sandbox in dir carries PendingName.
func hasPending(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, PendingName))
	return err == nil
}

// observedStart is startLocked, timed and counted as a start.
func (s *Supervisor) observedStart(ctx context.Context, l *store.Lock) (_ *Status, err error) {
	defer s.observe("start", time.Now(), &err)
	return s.startLocked(ctx, l)
}
