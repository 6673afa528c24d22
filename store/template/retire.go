package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// Outcome is the result of a retirement that did not fail.
type Outcome int

const (
	// Retired: the generation (or template) is gone (HTTP 204).
	Retired Outcome = iota + 1
	// Draining: leases remain; the generation is quarantined and marked "retire when
	// drained", and the release of its last lease finishes the retirement (HTTP 202).
	Draining
)

func (o Outcome) String() string {
	switch o {
	case Retired:
		return "retired"
	case Draining:
		return "draining"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// LeasedError is wrapped by a generation-leased error and lists the leases that remain.
type LeasedError struct {
	Leases []Lease
}

func (e *LeasedError) Error() string {
	var parts []string
	for _, l := range e.Leases {
		parts = append(parts, fmt.Sprintf("%s/%s lease %s by sandbox %s", l.Template, l.Generation, l.ID, l.Sandbox))
	}
	return "generation still leased: " + strings.Join(parts, ", ")
}

func leasedError(name, gen string, leases []Lease) error {
	var sbx []string
	for _, l := range leases {
		sbx = append(sbx, fmt.Sprintf("%s (generation %s, lease %s)", l.Sandbox, l.Generation, l.ID))
	}
	what := "Template " + name
	if gen != "" {
		what = "Generation " + gen + " of template " + name
	}
	return errcode.Wrap(errcode.GenerationLeased, &LeasedError{Leases: leases},
		"%s is still leased by clones: %s. Nothing was changed; delete those sandboxes first, or retire with drain=true to retire it once they are gone.", what, strings.Join(sbx, ", "))
}

// Tombstone quarantines a generation durably: no new lease, selection skips it, existing
// clones keep working. Tombstoning a tombstoned generation changes nothing.
func (s *Store) Tombstone(ctx context.Context, name, gen string) (*Generation, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	if err := ValidateGeneration(gen); err != nil {
		return nil, err
	}
	now, err := s.Now()
	if err != nil {
		return nil, err
	}
	var out *Generation
	err = s.withLock(ctx, func(tx *Tx) error {
		tdir, g, err := s.lookup(name, gen)
		if err != nil {
			return err
		}
		defer tdir.Close()
		if err := s.cleanTemplateDir(tdir, name); err != nil {
			return err
		}
		if g.tomb == nil {
			if g.tomb, err = s.writeTombstone(tdir, gen, false); err != nil {
				return err
			}
		}
		v := s.view(name, g, now)
		out = &v
		return nil
	})
	return out, err
}

func (s *Store) writeTombstone(tdir *os.File, gen string, drain bool) (*tombstoneRecord, error) {
	gdir, err := platform.OpenDirAt(tdir, gen)
	if err != nil {
		return nil, err
	}
	defer gdir.Close()
	t := &tombstoneRecord{Format: TombstoneFormat, At: time.Now().UTC(), Drain: drain}
	if err := s.writeRecord(gdir, TombstoneName, t, StepTombstone); err != nil {
		return nil, err
	}
	return t, nil
}

// Retire deletes a generation. It first sweeps the lease records whose clone binding is gone
// (bindingExists reports whether the sandbox sandboxID still has a clone.json naming leaseID;
// it must answer true when it cannot tell, and a nil bindingExists sweeps nothing). If leases
// remain, Retire fails with generation-leased naming them and changes nothing else; with drain
// it instead tombstones the generation "retire when drained" and returns Draining. Otherwise
// it tombstones the generation, then deletes the payload, the index entry and the tombstone,
// each durable before the next, and returns Retired: an interrupted retirement leaves a
// tombstoned generation that retiring again finishes.
func (s *Store) Retire(ctx context.Context, name, gen string, drain bool, bindingExists func(sandboxID, leaseID string) bool) (Outcome, error) {
	if err := ValidateName(name); err != nil {
		return 0, err
	}
	if err := ValidateGeneration(gen); err != nil {
		return 0, err
	}
	var out Outcome
	err := s.withLock(ctx, func(tx *Tx) error {
		tdir, rec, err := s.openTemplate(name)
		if err != nil {
			return err
		}
		defer tdir.Close()
		if err := s.cleanTemplateDir(tdir, name); err != nil {
			return err
		}
		leased, err := s.retire(tdir, name, gen, drain, bindingExists)
		if err != nil {
			return err
		}
		if len(leased) > 0 {
			if !drain {
				return leasedError(name, gen, leased)
			}
			out = Draining
			return nil
		}
		out = Retired
		if rec.Deleting {
			if gens, err := generationNames(tdir); err != nil {
				return err
			} else if len(gens) == 0 {
				return s.removeTemplate(tdir, name)
			}
		}
		return nil
	})
	return out, err
}

// retire runs a retirement of gen under the lock and returns the leases that keep it. The
// leases are counted first, under the store's lock, which every new lease is written under
// too, so that no clone can overtake the count: while leases remain, a retirement without
// drain changes nothing (but sweeping the lease records no clone names any more), and one
// with drain tombstones the generation "retire when drained". Without leases, it tombstones
// the generation durably and deletes it (see [Store.finishRetire]): an interrupted deletion
// leaves a tombstoned generation that retiring again finishes.
func (s *Store) retire(tdir *os.File, name, gen string, drain bool, bindingExists func(sandboxID, leaseID string) bool) ([]Lease, error) {
	g, leases, err := s.leasesOf(tdir, name, gen, bindingExists)
	if err != nil {
		return nil, err
	}
	if len(leases) > 0 {
		if drain && (g.tomb == nil || !g.tomb.Drain) {
			if _, err := s.writeTombstone(tdir, gen, true); err != nil {
				return nil, err
			}
		}
		return leases, nil
	}
	if g.tomb == nil {
		if g.tomb, err = s.writeTombstone(tdir, gen, false); err != nil {
			if errcode.StorageFaultOf(err) == errcode.FaultFull {
				return s.retireOnFullDisk(tdir, name, g, bindingExists, err)
			}
			return nil, err
		}
	}
	return nil, s.finishRetire(tdir, name, gen)
}

// leasesOf loads generation gen, sweeps its lease records that no clone names any more, and
// returns it with the leases that remain.
func (s *Store) leasesOf(tdir *os.File, name, gen string, bindingExists func(sandboxID, leaseID string) bool) (*genState, []Lease, error) {
	g, found, err := loadGeneration(tdir, gen)
	if err != nil {
		return nil, nil, err
	}
	if !found {
		return nil, nil, generationNotFound(name, gen)
	}
	gdir, err := platform.OpenDirAt(tdir, gen)
	if err != nil {
		return nil, nil, err
	}
	defer gdir.Close()
	leases, err := s.sweepLeases(gdir, g, bindingExists)
	if err != nil {
		return nil, nil, err
	}
	return g, leases, nil
}

// sweepLeases removes the lease records of g whose clone binding is gone (see Retire) and
// returns the leases that remain.
func (s *Store) sweepLeases(gdir *os.File, g *genState, bindingExists func(sandboxID, leaseID string) bool) ([]Lease, error) {
	leases, err := readLeases(gdir, g.leases)
	if err != nil {
		return nil, err
	}
	if bindingExists != nil && len(leases) > 0 {
		ldir, err := platform.OpenDirAt(gdir, LeasesDir)
		if err != nil {
			return nil, err
		}
		kept := leases[:0]
		for _, l := range leases {
			if bindingExists(l.Sandbox, l.ID) {
				kept = append(kept, l)
				continue
			}
			if err := s.removeEntry(ldir, l.ID+leaseExt, StepLeaseSweep); err != nil {
				ldir.Close()
				return nil, err
			}
		}
		ldir.Close()
		leases = kept
	}
	return leases, nil
}

// finishRetire deletes a tombstoned generation that no lease holds: payload, index entry,
// tombstone, each durably before the next, then the (empty) leases directory and the
// generation's directory.
func (s *Store) finishRetire(tdir *os.File, name, gen string) error {
	gdir, err := platform.OpenDirAt(tdir, gen)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer gdir.Close()
	if _, err := platform.LstatAt(gdir, TombstoneName); err != nil && errors.Is(err, fs.ErrNotExist) {
		// Only a quarantined generation is deleted; a generation whose tombstone is already
		// gone has lost its payload and index entry too (they go first).
		if _, ierr := platform.LstatAt(gdir, IndexName); ierr == nil {
			return fmt.Errorf("template: refusing to delete generation %s/%s without a tombstone", name, gen)
		}
	}
	if err := s.cleanGenerationDir(gdir); err != nil {
		return err
	}
	if _, err := platform.LstatAt(gdir, PayloadDir); err == nil {
		if err := s.opts.FS.RemoveAllAt(gdir, PayloadDir); err != nil {
			return fmt.Errorf("template: remove the payload of %s/%s: %w", name, gen, err)
		}
		if err := s.opts.FS.SyncDir(gdir); err != nil {
			return err
		}
		s.synced(StepRetirePayload)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := s.removeEntry(gdir, IndexName, StepRetireIndex); err != nil {
		return err
	}
	if err := s.removeEntry(gdir, TombstoneName, StepRetireTombstone); err != nil {
		return err
	}
	if err := s.opts.FS.RmdirAt(gdir, LeasesDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template: remove the leases directory of %s/%s: %w", name, gen, err)
	}
	names, err := platform.ReadDirNames(gdir)
	if err != nil {
		return err
	}
	if len(names) > 0 {
		slices.Sort(names)
		return errcode.New(errcode.ForeignFiles, "Generation %s of template %s was retired, but its directory holds entries bothyd does not own (%s); they were kept, remove them by hand.", gen, name, strings.Join(names, ", "))
	}
	return s.removeDir(tdir, gen, StepRetireDir)
}

// cleanGenerationDir removes temp leftovers of the generation's records and lease records;
// the caller holds the lock, under which all of them are written.
func (s *Store) cleanGenerationDir(gdir *os.File) error {
	if err := s.cleanTemps(gdir, func(target string) bool { return target == IndexName || target == TombstoneName }); err != nil {
		return err
	}
	ldir, err := platform.OpenDirAt(gdir, LeasesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer ldir.Close()
	return s.cleanTemps(ldir, func(target string) bool { _, ok := leaseIDOf(target); return ok })
}

// cleanTemps removes the regular temp files in dir whose target mine accepts.
func (s *Store) cleanTemps(dir *os.File, mine func(target string) bool) error {
	names, err := platform.ReadDirNames(dir)
	if err != nil {
		return err
	}
	removed := false
	for _, n := range names {
		target, ok := platform.IsTempName(n)
		if !ok || !mine(target) {
			continue
		}
		if st, err := platform.LstatAt(dir, n); err != nil || !st.IsRegular() {
			continue
		}
		if err := s.opts.FS.UnlinkAt(dir, n); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		removed = true
	}
	if removed {
		return s.opts.FS.SyncDir(dir)
	}
	return nil
}
