package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
)

// ProblemKind names an inconsistency that Check finds.
type ProblemKind string

const (
	// A lease record whose sandbox has no clone binding naming it (a clone that crashed
	// between lease and binding, or whose removal crashed between binding and release).
	// Repair removes the record.
	LeaseWithoutBinding ProblemKind = "lease-without-binding"
	// A generation directory with a payload but no index entry and no tombstone: only a
	// retirement on a full disk, interrupted, leaves one (it removes the index entry in place
	// of writing a tombstone). Repair tombstones it and, if no lease holds it, retires it.
	PayloadWithoutIndex ProblemKind = "payload-without-index"
	// An indexed, untombstoned generation whose payload is missing. Repair tombstones it, so
	// that no new clone uses it, and retires it if no lease holds it.
	IndexWithoutPayload ProblemKind = "index-without-payload"
	// A quarantined generation whose retirement was interrupted or waits for no lease any
	// more. Repair finishes the retirement.
	InterruptedRetirement ProblemKind = "interrupted-retirement"
	// A template being deleted with no generation left. Repair removes it.
	InterruptedDelete ProblemKind = "interrupted-delete"
	// A staging directory of a dead capture, or a temp file of a dead write. Repair removes it.
	StagingLeftover ProblemKind = "staging-leftover"
	// An entry the template store does not own. Never repaired: it is not ours to remove.
	ForeignEntry ProblemKind = "foreign-entry"
	// A record that does not read (unknown format, damaged). Never repaired.
	BadRecord ProblemKind = "bad-record"
)

// Problem is one inconsistency found by Check.
type Problem struct {
	Kind       ProblemKind
	Template   string
	Generation string
	Lease      string
	Sandbox    string
	// Entry is the path of the entry at fault, relative to the templates directory.
	Entry    string
	Detail   string
	Repaired bool
}

func (p Problem) String() string {
	r := ""
	if p.Repaired {
		r = " (repaired)"
	}
	return fmt.Sprintf("%s: %s: %s%s", p.Kind, p.Entry, p.Detail, r)
}

// Check looks for inconsistencies in the template store under its lock and, with repair,
// repairs those that are safe to repair (see the ProblemKind constants). bindingExists
// reports whether a sandbox still has a clone binding naming a lease (answer true when unsure);
// with a nil bindingExists leases are not checked.
func (s *Store) Check(ctx context.Context, bindingExists func(sandboxID, leaseID string) bool, repair bool) ([]Problem, error) {
	var out []Problem
	err := s.withLock(ctx, func(tx *Tx) error {
		names, err := platform.ReadDirNames(s.dir)
		if err != nil {
			return err
		}
		slices.Sort(names)
		for _, name := range names {
			if name == LockName {
				continue
			}
			if name == OutboxDir {
				ps, err := s.checkOutbox(repair)
				if err != nil {
					return fmt.Errorf("template: check %s: %w", name, err)
				}
				out = append(out, ps...)
				continue
			}
			st, err := platform.LstatAt(s.dir, name)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				return err
			}
			if !naming.ValidID(name) || !st.IsDir() {
				out = append(out, Problem{Kind: ForeignEntry, Entry: name, Detail: "not a template directory"})
				continue
			}
			ps, err := s.checkTemplate(name, bindingExists, repair)
			if err != nil {
				return fmt.Errorf("template: check %s: %w", name, err)
			}
			out = append(out, ps...)
		}
		return nil
	})
	return out, err
}

// RemoveLeftovers removes, under the store's lock, what dead writes and captures left in
// every template and generation directory: temp files of records (every record is written
// under the lock, so none is in flight) and staging directories no live capture holds. It is
// the start-up's share of check --repair: a SIGKILL mid-write would otherwise leave a temp file
// that check reports as staging-leftover until someone repairs it. Anything else check would
// report (foreign entries, unreadable records) is left for check to report.
func (s *Store) RemoveLeftovers(ctx context.Context) error {
	return s.withLock(ctx, func(tx *Tx) error {
		names, err := platform.ReadDirNames(s.dir)
		if err != nil {
			return err
		}
		if err := s.cleanOutbox(); err != nil {
			return fmt.Errorf("template: remove leftovers of %s: %w", OutboxDir, err)
		}
		for _, name := range names {
			if name == LockName || !naming.ValidID(name) {
				continue
			}
			if st, err := platform.LstatAt(s.dir, name); err != nil || !st.IsDir() {
				continue // gone, or foreign: check reports it
			}
			if err := s.removeTemplateLeftovers(name); err != nil {
				return fmt.Errorf("template: remove leftovers of %s: %w", name, err)
			}
		}
		return nil
	})
}

// removeTemplateLeftovers is RemoveLeftovers for one template's directory and its generations.
func (s *Store) removeTemplateLeftovers(name string) error {
	tdir, found, err := s.openTemplateDir(name)
	if err != nil || !found {
		return err
	}
	defer tdir.Close()
	if err := s.cleanTemplateDir(tdir, name); err != nil {
		return err
	}
	gens, err := generationNames(tdir)
	if err != nil {
		return err
	}
	for _, gen := range gens {
		gdir, err := platform.OpenDirAt(tdir, gen)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		err = s.cleanGenerationDir(gdir)
		gdir.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// checkTemplate checks one template's directory: its record, its entries, each generation,
// and a delete that did not finish.
func (s *Store) checkTemplate(name string, bindingExists func(string, string) bool, repair bool) ([]Problem, error) {
	tdir, found, err := s.openTemplateDir(name)
	if err != nil || !found {
		return nil, err
	}
	defer tdir.Close()
	rec, err := readTemplateRecord(tdir)
	if err != nil {
		return []Problem{{Kind: BadRecord, Template: name, Entry: name + "/" + TemplateRecordName, Detail: err.Error()}}, nil
	}
	out, err := s.checkTemplateEntries(tdir, name, repair)
	if err != nil {
		return nil, err
	}
	gens, err := generationNames(tdir)
	if err != nil {
		return nil, err
	}
	for _, gen := range gens {
		ps, err := s.checkGeneration(tdir, name, gen, bindingExists, repair)
		if err != nil {
			return nil, err
		}
		out = append(out, ps...)
	}
	p, err := s.checkInterruptedDelete(tdir, name, rec, repair)
	if err != nil {
		return nil, err
	}
	if p != nil {
		out = append(out, *p)
	}
	return out, nil
}

// checkTemplateEntries reports the entries of a template's directory that are not its record
// or a generation: leftovers of dead writes and captures (removed with repair; a live
// capture's staging is left alone) and foreign entries.
func (s *Store) checkTemplateEntries(tdir *os.File, name string, repair bool) ([]Problem, error) {
	names, err := platform.ReadDirNames(tdir)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []Problem
	for _, n := range names {
		if n == TemplateRecordName || (validGenerationName(n) && isDirAt(tdir, n)) {
			continue
		}
		if target, ok := platform.IsTempName(n); ok && (target == TemplateRecordName || validGenerationName(target)) {
			if target != TemplateRecordName {
				if dead, err := stagingDead(tdir, n); err != nil || !dead {
					continue // a live capture
				}
			}
			out = append(out, Problem{Kind: StagingLeftover, Template: name, Entry: name + "/" + n, Detail: "left by a write or capture that did not finish", Repaired: repair})
			continue
		}
		out = append(out, Problem{Kind: ForeignEntry, Template: name, Entry: name + "/" + n, Detail: "not an entry of the template store"})
	}
	if repair {
		if err := s.cleanTemplateDir(tdir, name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkInterruptedDelete reports a template that is deleted or being deleted (rec is nil or
// marked) and has no generation left; with repair it finishes the delete, unless foreign
// entries keep the directory.
func (s *Store) checkInterruptedDelete(tdir *os.File, name string, rec *templateRecord, repair bool) (*Problem, error) {
	if rec != nil && !rec.Deleting {
		return nil, nil
	}
	left, err := generationNames(tdir)
	if err != nil || len(left) > 0 {
		return nil, err
	}
	p := &Problem{Kind: InterruptedDelete, Template: name, Entry: name, Detail: "a deleted template whose directory remains"}
	if repair {
		if rec != nil {
			err = s.removeTemplate(tdir, name)
		} else {
			err = s.removeTemplateDirIfEmpty(tdir, name)
		}
		if err != nil && errcode.Of(err) != errcode.ForeignFiles {
			return nil, err
		}
		p.Repaired = err == nil
	}
	return p, nil
}

// checkGeneration checks one generation: its records, its entries, its leases against their
// sandboxes' bindings, and whether its records and payload are in a state that some step of
// this store leaves.
func (s *Store) checkGeneration(tdir *os.File, name, gen string, bindingExists func(string, string) bool, repair bool) ([]Problem, error) {
	entry := name + "/" + gen
	g, found, err := loadGeneration(tdir, gen)
	if err != nil {
		return []Problem{{Kind: BadRecord, Template: name, Generation: gen, Entry: entry, Detail: err.Error()}}, nil
	}
	if !found {
		return nil, nil
	}
	gdir, err := platform.OpenDirAt(tdir, gen)
	if err != nil {
		return nil, err
	}
	defer gdir.Close()
	out, err := s.checkGenerationEntries(gdir, name, gen, repair)
	if err != nil {
		return nil, err
	}
	leases, err := readLeases(gdir, g.leases)
	if err != nil {
		return append(out, Problem{Kind: BadRecord, Template: name, Generation: gen, Entry: entry + "/" + LeasesDir, Detail: err.Error()}), nil
	}
	ps, kept, err := s.checkLeases(gdir, name, gen, leases, bindingExists, repair)
	if err != nil {
		return nil, err
	}
	out = append(out, ps...)
	p := generationProblem(g, kept)
	if p == nil {
		return out, nil
	}
	p.Template, p.Generation, p.Entry = name, gen, entry
	if repair {
		if err := s.repairGeneration(tdir, name, g, kept, p); err != nil {
			return nil, err
		}
	}
	return append(out, *p), nil
}

// checkGenerationEntries reports the entries of a generation's directory that are not its
// own: temp leftovers of its records (removed with repair) and foreign entries.
func (s *Store) checkGenerationEntries(gdir *os.File, name, gen string, repair bool) ([]Problem, error) {
	entry := name + "/" + gen
	names, err := platform.ReadDirNames(gdir)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []Problem
	for _, n := range names {
		switch n {
		case IndexName, TombstoneName, PayloadDir, LeasesDir:
			continue
		}
		if target, ok := platform.IsTempName(n); ok && (target == IndexName || target == TombstoneName) {
			out = append(out, Problem{Kind: StagingLeftover, Template: name, Generation: gen, Entry: entry + "/" + n, Detail: "left by a write that did not finish", Repaired: repair})
			continue
		}
		out = append(out, Problem{Kind: ForeignEntry, Template: name, Generation: gen, Entry: entry + "/" + n, Detail: "not an entry of the template store"})
	}
	if repair {
		if err := s.cleanGenerationDir(gdir); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkLeases reports the leases whose sandbox has no clone binding naming them, and with
// repair removes their records. kept is how many leases still hold the generation: all of
// them when bindingExists is nil, and without repair.
func (s *Store) checkLeases(gdir *os.File, name, gen string, leases []Lease, bindingExists func(string, string) bool, repair bool) (out []Problem, kept int, err error) {
	for _, l := range leases {
		if bindingExists == nil || bindingExists(l.Sandbox, l.ID) {
			kept++
			continue
		}
		p := Problem{Kind: LeaseWithoutBinding, Template: name, Generation: gen, Lease: l.ID, Sandbox: l.Sandbox,
			Entry: name + "/" + gen + "/" + LeasesDir + "/" + l.ID + leaseExt, Detail: "sandbox " + l.Sandbox + " has no clone binding naming this lease"}
		if repair {
			if err := s.sweepLease(gdir, l.ID); err != nil {
				return nil, 0, err
			}
			p.Repaired = true
		} else {
			kept++
		}
		out = append(out, p)
	}
	return out, kept, nil
}

// sweepLease removes the record of the lease id from the generation's directory gdir.
func (s *Store) sweepLease(gdir *os.File, id string) error {
	ldir, err := platform.OpenDirAt(gdir, LeasesDir)
	if err != nil {
		return err
	}
	defer ldir.Close()
	return s.removeEntry(ldir, id+leaseExt, StepLeaseSweep)
}

// generationProblem returns the problem of a generation whose records and payload are in a
// state that no step of this store leaves, or that an interrupted retirement left; kept is
// how many leases still hold it. It returns nil for a consistent generation.
func generationProblem(g *genState, kept int) *Problem {
	switch {
	case g.tomb == nil && g.index == nil && g.payload:
		return &Problem{Kind: PayloadWithoutIndex, Detail: "a payload without an index entry or tombstone"}
	case g.tomb == nil && g.index != nil && !g.payload:
		return &Problem{Kind: IndexWithoutPayload, Detail: "an index entry whose payload is missing"}
	case g.tomb == nil && g.index == nil:
		return &Problem{Kind: InterruptedRetirement, Detail: "an empty generation directory"}
	case g.tomb != nil && (g.index == nil || !g.payload || (g.tomb.Drain && kept == 0)):
		return &Problem{Kind: InterruptedRetirement, Detail: "a retirement that did not finish"}
	}
	return nil
}

// repairGeneration repairs the problem p of generation g: it tombstones an untombstoned
// generation, so that no new clone uses it, and retires it if no lease holds it (unless
// foreign entries keep it). It sets p.Repaired.
func (s *Store) repairGeneration(tdir *os.File, name string, g *genState, kept int, p *Problem) error {
	if g.tomb == nil && (g.index != nil || g.payload) {
		_, err := s.writeTombstone(tdir, g.id, false)
		switch {
		case err == nil:
			p.Repaired = p.Kind == IndexWithoutPayload
		case g.index == nil && kept == 0 && errcode.StorageFaultOf(err) == errcode.FaultFull:
			// On a full disk a generation without an index entry, which nothing can lease,
			// is retired without the tombstone, as Retire does.
		default:
			return err
		}
	}
	if kept == 0 {
		err := s.finishRetire(tdir, name, g.id)
		if err != nil && errcode.Of(err) != errcode.ForeignFiles {
			return err
		}
		p.Repaired = err == nil
	}
	return nil
}
