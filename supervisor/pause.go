package supervisor

import (
	"context"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// PausedName is the pause record, and pausedFormat its record format.
const (
	PausedName   = "paused.json"
	pausedFormat = 1
)

// StatePaused is a running sandbox whose processes are frozen.
const StatePaused State = "paused"

// The events of a pause and a resume.
const (
	EventPaused  = "sandbox.paused"
	EventResumed = "sandbox.resumed"
)

// pauseRecord is paused.json: the sandbox's launch LaunchID is paused. The record is the
// truth and the cgroup follows it: a pause writes the record durably and then freezes; a
// resume removes the record durably and then thaws. A crash between the two steps leaves a
// record and a cgroup that disagree, and reattach makes the cgroup agree with the record
// (see [Supervisor.reconcilePause]), so a pause that answered survives any crash and a resume
// that answered does too.
type pauseRecord struct {
	Format   int       `json:"format"`
	LaunchID string    `json:"launch_id"`
	At       time.Time `json:"at"`
	// Memory is "released" for a pause that saved the sandbox's memory and gave it back to
	// the host ([runtime.MemoryReleaser]); Time is then the time contract of the release,
	// by which a resume checks its downtime as a clone's restore checks its generation's.
	Memory string                 `json:"memory,omitempty"`
	Time   *template.TimeContract `json:"time,omitempty"`
	// Reason is [PauseIdle] for a sandbox put to sleep because it was idle (sleep.go), ""
	// for a pause asked for.
	Reason string `json:"reason,omitempty"`
}

// MemoryReleased is a pause record's Memory of a pause that released the memory.
const MemoryReleased = "released"

func readPause(dir string) (*pauseRecord, error) {
	var p pauseRecord
	if found, err := readOwnRecord(dir, PausedName, pausedFormat, &p); err != nil || !found {
		return nil, err
	}
	return &p, nil
}

func removePause(dir string) error { return removeOwnRecord(dir, PausedName) }

// pausedLaunch reports whether the sandbox in dir is paused in launch launchID.
func pausedLaunch(dir, launchID string) bool {
	p, err := readPause(dir)
	return err == nil && p != nil && p.LaunchID == launchID
}

func pausedError(id string) error {
	return errcode.New(errcode.SandboxPaused, "Sandbox %s is paused; resume it first.", id)
}

// pauser is the default runtime's Pauser.
func (s *Supervisor) pauser() (runtime.Pauser, error) { return pauserOf(s.rt) }

// pauserOf is rt as a Pauser, or why it cannot pause sandboxes.
func pauserOf(rt runtime.Runtime) (runtime.Pauser, error) {
	p, ok := rt.(runtime.Pauser)
	if !ok {
		return nil, errcode.New(errcode.Unavailable, "The %s runtime cannot pause sandboxes.", rt.Kind())
	}
	if err := p.PauseSupport(); err != nil {
		return nil, errcode.Wrap(errcode.Unavailable, err, "This host cannot pause sandboxes: it has no usable cgroup freezer.")
	}
	return p, nil
}

// Pause freezes every process of a running sandbox. Pausing a paused sandbox is not an
// error. Exec, files and streams are refused while it is paused (sandbox-paused); stop and
// a forced delete thaw it first.
func (s *Supervisor) Pause(ctx context.Context, id string) (*Status, error) {
	return s.pause(ctx, id, false, "")
}

// PauseReleasing pauses a running sandbox and releases its memory: saved to its state
// directory and given back to the host ([runtime.MemoryReleaser], the microvm runtime), the
// launch living on; Resume restores it. A sandbox paused already has its memory released.
func (s *Supervisor) PauseReleasing(ctx context.Context, id string) (*Status, error) {
	return s.pause(ctx, id, true, "")
}

// pause pauses sandbox id, for reason ("" or [PauseIdle]).
func (s *Supervisor) pause(ctx context.Context, id string, release bool, reason string) (_ *Status, err error) {
	defer s.observe("pause", time.Now(), &err)
	p, err := s.sandboxPauser(id)
	if err != nil {
		return nil, err
	}
	mr, canRelease := p.(runtime.MemoryReleaser)
	if release && !canRelease {
		return nil, errcode.New(errcode.Unavailable, "Sandbox %s's runtime cannot release a paused sandbox's memory; pause it without \"memory\": \"release\".", id)
	}
	l, cfg, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(l)
	r, err := s.reattach(ctx, l)
	if err != nil {
		return nil, err
	}
	// A sleep looks again under the lock: a use that began since the watch judged the sandbox
	// idle keeps it awake (a use begins before it takes this lock, sleep.go).
	if s.sleepCalledOff(reason, cfg) {
		return nil, errNotIdle
	}
	switch {
	case r.mismatch:
		return nil, mismatchError(id)
	case r.state != StateRunning:
		return nil, errcode.New(errcode.NotRunning, "Sandbox %s is not running, so it cannot be paused.", id)
	case r.paused && !release:
		return s.Status(id)
	}
	rec := &pauseRecord{Format: pausedFormat, LaunchID: r.rec.LaunchID, At: time.Now().UTC(), Reason: reason}
	if r.paused {
		if rec, err = readPause(l.Dir()); err != nil || rec == nil {
			return nil, errcode.Wrap(errcode.Internal, err, "The pause record of sandbox %s does not read.", id)
		}
		if rec.Memory == MemoryReleased {
			return s.Status(id)
		}
	}
	if release {
		now, err := s.timeNow()
		if err != nil {
			return nil, err
		}
		rec.Memory, rec.Time = MemoryReleased, &now
	}
	data, err := record.Encode(rec)
	if err != nil {
		return nil, err
	}
	if err := platform.WriteFileDurable(l.Dir(), PausedName, data, record.Perm); err != nil {
		return nil, err
	}
	s.crash("pause-recorded")
	if release {
		err = mr.ReleaseMemory(ctx, id, l.Dir())
		s.dropClient(id) // its session was the released guest's
	} else {
		err = p.Freeze(ctx, id, l.Dir())
	}
	if err != nil {
		// Undo: the sandbox runs on (or stays paused, its memory kept), and the record must
		// not say otherwise.
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		if r.paused {
			rec.Memory, rec.Time = "", nil
			if data, eerr := record.Encode(rec); eerr == nil {
				_ = platform.WriteFileDurable(l.Dir(), PausedName, data, record.Perm)
			}
		} else if rerr := removePause(l.Dir()); rerr == nil {
			_ = p.Thaw(cctx, id, l.Dir())
		}
		if ctx.Err() != nil {
			s.log.Warn("a pause did not finish in time", "sandbox", id, "err", err)
			return nil, errcode.Wrap(errcode.TransitionInProgress, err, "Sandbox %s did not pause within the timeout and runs on; retry, with a longer timeout.", id)
		}
		return nil, err
	}
	s.emitPaused(id, reason)
	return s.Status(id)
}

// timeNow is the host's time contract now, the template store's clock when there is one.
func (s *Supervisor) timeNow() (template.TimeContract, error) {
	if s.templates != nil {
		return s.templates.Now()
	}
	return template.HostNow()
}

// maxDowntime is the restore window: the template store's maximum age of a generation, which
// a released pause's memory shares.
func (s *Supervisor) maxDowntime() time.Duration {
	if s.templates != nil {
		return s.templates.MaxAge()
	}
	return template.DefaultMaxAge
}

// checkReleased refuses the resume of a pause whose memory was released when its downtime, by
// the release's time contract, is negative (early) or beyond the restore window (expired),
// as a clone's restore is refused.
func (s *Supervisor) checkReleased(id string, pr *pauseRecord) error {
	if pr.Memory != MemoryReleased || pr.Time == nil {
		return nil
	}
	now, err := s.timeNow()
	if err != nil {
		return err
	}
	elig, down := template.EligibilityAt(*pr.Time, now, s.maxDowntime())
	if elig != template.Eligible {
		return errcode.New(errcode.TemplateIneligible, "Sandbox %s was paused with its memory released %v ago and is %s (restore window %v): its memory cannot be restored. Stop it, which discards the memory, and start it again.",
			id, down.Round(time.Millisecond), elig, s.maxDowntime())
	}
	return nil
}

// Resume thaws a paused sandbox. Resuming a running sandbox that is not paused is not an
// error.
func (s *Supervisor) Resume(ctx context.Context, id string) (_ *Status, err error) {
	defer s.observe("resume", time.Now(), &err)
	p, err := s.sandboxPauser(id)
	if err != nil {
		return nil, err
	}
	l, _, err := s.lockProvisioned(ctx, id)
	if err != nil {
		return nil, err
	}
	defer s.unlock(l)
	r, err := s.reattach(ctx, l)
	if err != nil {
		return nil, err
	}
	switch {
	case r.mismatch:
		return nil, mismatchError(id)
	case r.state != StateRunning:
		return nil, errcode.New(errcode.NotRunning, "Sandbox %s is not running, so it cannot be resumed.", id)
	case !r.paused:
		// Thawed all the same: a capture whose thaw failed leaves a running sandbox frozen
		// without a pause record, and a resume is how to retry that thaw.
		if err := p.Thaw(ctx, id, l.Dir()); err != nil {
			return nil, err
		}
		// And joined: a resume of released memory whose join failed is retried so.
		if err := s.rejoinNetwork(l, r.rec); err != nil {
			return nil, rejoinError(id, err)
		}
		return s.Status(id)
	}
	pr, err := readPause(l.Dir())
	if err != nil {
		return nil, err
	}
	if err := s.checkReleased(id, pr); err != nil {
		return nil, err
	}
	if err := removePause(l.Dir()); err != nil {
		return nil, err
	}
	s.crash("resume-recorded")
	if err := p.Thaw(ctx, id, l.Dir()); err != nil {
		// The sandbox may still be frozen: record it paused again, so that the record does
		// not lie, and a retry resumes it.
		if data, eerr := record.Encode(pr); eerr == nil {
			_ = platform.WriteFileDurable(l.Dir(), PausedName, data, record.Perm)
		}
		if ctx.Err() != nil {
			return nil, errcode.Wrap(errcode.TransitionInProgress, err, "Sandbox %s did not thaw within the timeout and is still paused; retry, with a longer timeout.", id)
		}
		return nil, err
	}
	if pr.Memory == MemoryReleased {
		s.dropClient(id) // a session of before the release is gone
		if err := s.rejoinNetwork(l, r.rec); err != nil {
			return nil, rejoinError(id, err)
		}
	}
	s.emit(Event{Type: EventResumed, Sandbox: id, State: StateRunning})
	if pr.Reason == PauseIdle {
		// A resume of a sleeper is its wake, however it came (a request that needed it, an
		// explicit resume, E2B's connect): its idle clock starts again from now.
		s.activity.Touch(id)
		s.emit(Event{Type: EventAwake, Sandbox: id, State: StateRunning})
	}
	return s.Status(id)
}

// rejoinError is a resume whose guest runs again but whose network could not be joined to it.
func rejoinError(id string, err error) error {
	return errcode.Wrap(errcode.Unavailable, err, "Sandbox %s runs again, but its network could not be joined to its restored guest (%v); resume it again to retry.", id, err)
}

// thawForStop thaws a sandbox before a stop ends it, and removes its pause record. A sandbox
// whose memory is released is not restored to be stopped: released says so, and the stop
// ends its launch by force (there is no guest to shut down gracefully), discarding the memory.
func (s *Supervisor) thawForStop(ctx context.Context, l *store.Lock) (released bool, err error) {
	rec, err := readPause(l.Dir())
	if err != nil || rec == nil {
		return false, err
	}
	if err := removePause(l.Dir()); err != nil {
		return false, err
	}
	if rec.Memory == MemoryReleased {
		return true, nil
	}
	rt, err := s.lockedRuntime(l)
	if err != nil {
		return false, err
	}
	p, ok := rt.(runtime.Pauser)
	if !ok {
		return false, nil
	}
	return false, p.Thaw(ctx, l.ID(), l.Dir())
}

// reconcilePause makes the freezer state of the sandbox l locks agree with its pause record
// and reports whether it is paused. rec is the live launch's runtime record, nil when the
// sandbox does not run: a pause record then is stale, and goes. thorough also thaws a frozen
// sandbox without a record (a resume that crashed between its two steps); it costs a look
// at the cgroup, so it is for start-up ([Supervisor.ReattachAll]).
func (s *Supervisor) reconcilePause(ctx context.Context, l *store.Lock, rec *store.RuntimeRecord, thorough bool) (bool, error) {
	pr, err := readPause(l.Dir())
	if err != nil {
		return false, err
	}
	rt, err := s.lockedRuntime(l)
	if err != nil {
		return false, err
	}
	p, canPause := rt.(runtime.Pauser)
	if rec == nil || (pr != nil && pr.LaunchID != rec.LaunchID) {
		if pr == nil {
			return false, nil
		}
		if canPause {
			if err := p.Thaw(ctx, l.ID(), l.Dir()); err != nil {
				return false, err
			}
		}
		return false, removePause(l.Dir())
	}
	if !canPause {
		return pr != nil, nil
	}
	if pr == nil && !thorough {
		return false, nil
	}
	frozen, err := p.Frozen(l.ID(), l.Dir())
	if err != nil {
		return false, err
	}
	switch {
	case pr != nil && !frozen:
		s.log.Warn("finishing an interrupted pause", "sandbox", l.ID())
		if err := p.Freeze(ctx, l.ID(), l.Dir()); err != nil {
			return false, err
		}
	case pr == nil:
		if frozen {
			s.log.Warn("finishing an interrupted resume", "sandbox", l.ID())
		}
		// Also when it reads thawed: on cgroup v1 a crash may have left the freezer
		// cgroup of an interrupted pause or resume, which Thaw removes.
		if err := p.Thaw(ctx, l.ID(), l.Dir()); err != nil {
			return false, err
		}
	}
	return pr != nil, nil
}

// PauseFacts is what [InspectPause] found of a sandbox's pause.
type PauseFacts struct {
	// Recorded: paused.json names the launch asked about; Stale: it names another launch.
	Recorded, Stale bool
	// Frozen: the runtime reads the sandbox's processes as frozen.
	Frozen bool
}

// InspectPause reads a sandbox's pause record and, if rt can pause, its freezer state, without
// its lock and without changing anything, for the consistency checker. launchID is the live
// launch's, "" when none runs.
func InspectPause(rt runtime.Runtime, id, dir, launchID string) (PauseFacts, error) {
	var f PauseFacts
	pr, err := readPause(dir)
	if err != nil {
		return f, err
	}
	f.Recorded = pr != nil && launchID != "" && pr.LaunchID == launchID
	f.Stale = pr != nil && !f.Recorded
	if p, ok := rt.(runtime.Pauser); ok && launchID != "" && p.PauseSupport() == nil {
		if f.Frozen, err = p.Frozen(id, dir); err != nil {
			return f, err
		}
	}
	return f, nil
}
