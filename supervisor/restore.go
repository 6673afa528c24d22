package supervisor

import (
	"fmt"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/store/template"
)

// RestoreName marks a clone of a memory generation (a [runtime.MemoryCapturer]'s) whose
// memory state is still to be restored, and restoreFormat is its record format. The clone
// writes it with its provision; the launch that restores the state removes it once the
// restored guest answers, before the launch commits, so that every later start boots the
// clone's own disk rather than restore the state over it. A launch that fails keeps it: the
// next start restores again (onto a disk made anew over the generation's).
const (
	RestoreName   = "restore.json"
	restoreFormat = 1
)

type restoreRecord struct {
	Format     int    `json:"format"`
	Template   string `json:"template,omitempty"`
	Generation string `json:"generation,omitempty"`
	// Fork, set instead of Template and Generation, is a fork of a running microVM, which
	// restores the state saved in its own fork-state (forkmemory.go).
	Fork *forkRestore `json:"fork,omitempty"`
	// Checkpoint, set instead, is a rollback to a microVM's checkpoint that holds its memory
	// (checkpointmemory.go), which the next start restores.
	Checkpoint *checkpointRestore `json:"checkpoint,omitempty"`
}

// checkpointRestore is a rollback's restore: the checkpoint, its layer (the top of the
// sandbox's chain while the mark holds) and when it was taken, by UTC.
type checkpointRestore struct {
	Name    string    `json:"name"`
	Layer   string    `json:"layer"`
	SavedAt time.Time `json:"saved_at"`
}

// forkRestore is a fork's restore: the sandbox it was forked from (for the operator) and
// when its state was saved, by UTC, which its guest's clock is advanced from.
type forkRestore struct {
	Source  string    `json:"source"`
	SavedAt time.Time `json:"saved_at"`
}

func writeRestore(dir, tmpl, gen string) error {
	return writeRestoreRecord(dir, &restoreRecord{Format: restoreFormat, Template: tmpl, Generation: gen})
}

func writeRestoreRecord(dir string, r *restoreRecord) error {
	data, err := record.Encode(r)
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(dir, RestoreName, data, record.Perm)
}

func readRestore(dir string) (*restoreRecord, error) {
	var r restoreRecord
	if found, err := readOwnRecord(dir, RestoreName, restoreFormat, &r); err != nil || !found {
		return nil, err
	}
	return &r, nil
}

func removeRestore(dir string) error { return removeOwnRecord(dir, RestoreName) }

// restoreFor is what the launch of the sandbox l locks restores: nil for a boot, or, for a
// clone whose memory state is still to be restored, the restore with the clock's advance (for
// a fork of a running microVM, [forkRestoreFor]).
// It checks the generation's eligibility by its time contract at this moment, before
// anything of the launch is made: the downtime is measured by the monotonic clock on the
// capture's host and boot and by UTC otherwise; a negative one is early, one beyond the
// restore window expired, and either is refused (template-ineligible). A tombstoned
// generation still restores: a tombstone stops new leases, not the clones that hold one.
func (s *Supervisor) restoreFor(l *store.Lock, cfg *store.Config) (*runtime.Restore, error) {
	rr, err := readRestore(l.Dir())
	if err != nil || rr == nil {
		return nil, err
	}
	if rr.Checkpoint != nil {
		return s.checkpointRestoreFor(l, cfg, rr)
	}
	if rr.Fork != nil {
		if err := checkForkRestore(l.Dir(), cfg); err != nil {
			return nil, err
		}
		return forkRestoreFor(rr), nil
	}
	if cfg.Template == nil || cfg.Template.Template != rr.Template || cfg.Template.Generation != rr.Generation {
		return nil, errcode.New(errcode.Internal, "Sandbox %s is to restore generation %s of template %s, which it was not cloned from; delete it.", cfg.ID, rr.Generation, rr.Template)
	}
	if err := s.requireTemplates(); err != nil {
		return nil, err
	}
	now, err := s.templates.Now()
	if err != nil {
		return nil, err
	}
	g, err := s.templates.Generation(rr.Template, rr.Generation, now)
	if err != nil {
		return nil, err
	}
	if !g.Indexed {
		return nil, errcode.New(errcode.GenerationNotFound, "Generation %s of template %s is being retired; sandbox %s cannot restore it.", g.ID, g.Template, cfg.ID)
	}
	elig, down := template.EligibilityAt(g.Time, now, s.templates.MaxAge())
	if elig != template.Eligible {
		return nil, errcode.New(errcode.TemplateIneligible,
			"Generation %s of template %s is %s (downtime %v, restore window %v): sandbox %s cannot restore its memory. Delete it and clone an eligible generation.",
			g.ID, g.Template, elig, down.Round(time.Millisecond), s.templates.MaxAge(), cfg.ID)
	}
	return &runtime.Restore{ClockAdvance: down}, nil
}

// restored removes a clone's restore mark once its restored guest answered.
func restored(dir string) error {
	if err := removeRestore(dir); err != nil {
		return fmt.Errorf("removing the restore mark: %w", err)
	}
	return nil
}
