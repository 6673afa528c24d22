package supervisor

import (
	"context"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/volume"
)

// The types of Event.
const (
	EventCreated = "sandbox.created"
	EventStarted = "sandbox.started"
	EventStopped = "sandbox.stopped"
	EventExited  = "sandbox.exited"
	EventDeleted = "sandbox.deleted"
)

// The types of the events of checkpoints, rollbacks, forks (checkpoints.go, fork.go) and
// volumes (the volume store's changes, volumes.go).
const (
	EventCheckpointCreated = "checkpoint.created"
	EventCheckpointDeleted = "checkpoint.deleted"
	EventRolledBack        = "sandbox.rolled-back"
	EventForked            = "sandbox.forked"
	EventVolumeCreated     = volume.ChangeCreated
	EventVolumeDeleted     = volume.ChangeDeleted
)

// Event is a change that this supervisor made or noticed: of a sandbox's state, or of a
// template generation or lease.
type Event struct {
	Type    string
	Sandbox string
	State   State
	// Exit is how the sandbox ended, for EventExited and EventStopped.
	Exit *Exit
	// Template, Generation and Lease name what a template event is about.
	Template, Generation, Lease string
	// Progress is a capture's progress, for EventProgress.
	Progress *Progress
	// Image names what an image event is about; Error is why a pull failed, for
	// EventImageFailed; ImageProgress is a pull's, for EventImagePullProgress.
	Image         string
	Error         string
	ImageProgress *ImageProgress
	// Checkpoint names the checkpoint of a checkpoint event or of EventRolledBack.
	Checkpoint string
	// Forks are the sandboxes a fork made, for EventForked (whose Sandbox is the source).
	Forks []string
	// Volume names what a volume event is about.
	Volume string
}

// Progress is how far a capture has come.
type Progress struct {
	Phase       string // copying
	Done, Total int64  // bytes
}

// emit reports an event to the OnEvent hook.
func (s *Supervisor) emit(e Event) {
	if s.hidesEvent(e.Sandbox) {
		if e.Type == EventExited {
			s.spareExited(e.Sandbox)
		}
		return
	}
	if s.onEvent != nil {
		s.onEvent(e)
	}
}

// observe reports a transition's duration and result to the OnTransition hook; deferred, it
// reads the result through errp when the transition returns.
func (s *Supervisor) observe(op string, start time.Time, errp *error) {
	if s.onTransition != nil {
		s.onTransition(op, time.Since(start), *errp)
	}
}

// watch follows a running launch until its runtime process exits, and then reconciles the
// sandbox at once, so that a sandbox that ended by itself reads as stopped (and its cgroup is
// released) without waiting for the next transition. One watcher runs per launch.
func (s *Supervisor) watch(id string, rec *store.RuntimeRecord) {
	s.mu.Lock()
	if s.watched[id] == rec.LaunchID || s.closed {
		s.mu.Unlock()
		return
	}
	s.watched[id] = rec.LaunchID
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			if s.watched[id] == rec.LaunchID {
				delete(s.watched, id)
			}
			s.mu.Unlock()
		}()
		if err := platform.WaitExit(s.life, processOf(rec)); err != nil {
			return // shutting down, or pidfds unavailable: the next transition reconciles
		}
		s.noticeExit(id, rec.LaunchID)
	}()
}

// noticeExit reconciles a sandbox whose runtime process exited, if the record still names
// that launch: a stop or another process may have dealt with it already.
func (s *Supervisor) noticeExit(id, launchID string) {
	for attempt := 0; attempt < 10; attempt++ {
		ctx, cancel := context.WithTimeout(s.life, 30*time.Second)
		l, err := s.store.LockExisting(ctx, id)
		if err != nil {
			cancel()
			if errcode.Of(err) == errcode.TransitionInProgress && s.life.Err() == nil {
				continue // a long transition holds it; it reconciles itself, but make sure
			}
			return
		}
		rec, err := l.RuntimeRecord()
		if err == nil && rec != nil && rec.LaunchID == launchID && !processOf(rec).Alive() {
			var r reconciled
			if r, err = s.reattach(ctx, l); err == nil {
				outcome, _ := l.Outcome()
				s.emit(Event{Type: EventExited, Sandbox: id, State: r.state, Exit: outcome})
			}
		}
		if err != nil {
			s.log.Warn("reconciling a sandbox that ended", "sandbox", id, "err", err)
		}
		s.unlock(l)
		cancel()
		return
	}
}
