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
	Template   string `json:"template"`
	Generation string `json:"generation"`
}

func writeRestore(dir, tmpl, gen string) error {
	data, err := record.Encode(&restoreRecord{Format: restoreFormat, Template: tmpl, Generation: gen})
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
// clone whose memory state is still to be restored, the restore with the clock's advance.
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
