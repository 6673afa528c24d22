package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// Leasable checks, under the lock, that a clone may lease generation gen of template name at
// the host time now: the generation is indexed, its payload present, not tombstoned, and
// eligible. Errors: template-not-found, generation-not-found, template-tombstoned,
// template-ineligible (saying early or expired). It reads three small records, whatever the
// payload's size. The returned view's Key is what the clone must be configured with.
func (tx *Tx) Leasable(name, gen string, now TimeContract) (_ *Generation, err error) {
	defer func() { err = tx.s.storage(err) }()
	if err := tx.check(); err != nil {
		return nil, err
	}
	tdir, g, err := tx.s.lookup(name, gen)
	if err != nil {
		return nil, err
	}
	tdir.Close()
	if err := leasable(name, g); err != nil {
		return nil, err
	}
	v := tx.s.view(name, g, now)
	if v.Eligibility != Eligible {
		return nil, errcode.New(errcode.TemplateIneligible, "Generation %s of template %s is %s (captured at %s); capture a new generation.",
			gen, name, v.Eligibility, v.CapturedAt.Format(time.RFC3339))
	}
	return &v, nil
}

// leasable checks what WriteLease checks again: tombstone, index entry, payload.
func leasable(name string, g *genState) error {
	if g.tomb != nil {
		return errcode.New(errcode.TemplateTombstoned, "Generation %s of template %s is tombstoned and takes no new clones; use another generation.", g.id, name)
	}
	if g.index == nil || !g.payload {
		return errcode.New(errcode.GenerationNotFound, "Template %s has no generation %s (its retirement began); use another generation.", name, g.id)
	}
	return nil
}

// Select is Store.Select under the lock: the generation it returns stays leasable until the
// lock is released.
func (tx *Tx) Select(name string, key Key, now TimeContract) (_ *Generation, err error) {
	defer func() { err = tx.s.storage(err) }()
	if err := tx.check(); err != nil {
		return nil, err
	}
	return tx.s.Select(name, key, now)
}

// WriteLease writes a new lease record of generation gen for the sandbox sandboxID, durably,
// and returns it. The caller checked the generation with Leasable (or Select) under this same
// lock, and checked the sandbox under its lifecycle lock (provisioned, no runtime record, no
// journal, no clone binding); it then writes the sandbox's clone.json with WriteBinding
// before it releases either lock. WriteLease checks the tombstone and the index entry again,
// so a lease is never written for a quarantined generation.
func (tx *Tx) WriteLease(name, gen, sandboxID string) (_ *Lease, err error) {
	defer func() { err = tx.s.storage(err) }()
	if err := tx.check(); err != nil {
		return nil, err
	}
	if err := validSandboxID(sandboxID); err != nil {
		return nil, err
	}
	tdir, g, err := tx.s.lookup(name, gen)
	if err != nil {
		return nil, err
	}
	defer tdir.Close()
	if err := leasable(name, g); err != nil {
		return nil, err
	}
	gdir, err := platform.OpenDirAt(tdir, gen)
	if err != nil {
		return nil, err
	}
	defer gdir.Close()
	ldir, err := tx.s.openLeasesDir(gdir)
	if err != nil {
		return nil, err
	}
	defer ldir.Close()
	rec := &leaseRecord{Format: LeaseFormat, ID: newLeaseID(), Template: name, Generation: gen, Sandbox: sandboxID, AcquiredAt: time.Now().UTC()}
	if err := tx.s.writeRecord(ldir, rec.ID+leaseExt, rec, StepLeaseWrite); err != nil {
		return nil, err
	}
	return &Lease{ID: rec.ID, Template: name, Generation: gen, Sandbox: sandboxID, AcquiredAt: rec.AcquiredAt}, nil
}

// openLeasesDir opens (making it durably if missing) a generation's leases directory.
func (s *Store) openLeasesDir(gdir *os.File) (*os.File, error) {
	ldir, err := platform.OpenDirAt(gdir, LeasesDir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := s.opts.FS.MkdirAt(gdir, LeasesDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		if err := s.opts.FS.SyncDir(gdir); err != nil {
			return nil, err
		}
		ldir, err = platform.OpenDirAt(gdir, LeasesDir)
	}
	return ldir, err
}

// NewBinding returns the clone binding of a lease, for WriteBinding.
func NewBinding(l *Lease) *Binding {
	return &Binding{Format: BindingFormat, Template: l.Template, Generation: l.Generation, Lease: l.ID, AcquiredAt: l.AcquiredAt}
}

// CheckUnbound fails with sandbox-leased when the sandbox state directory dir already holds a
// clone binding: a sandbox holds at most one lease.
func CheckUnbound(dir, sandboxID string) error {
	b, err := ReadBinding(dir)
	if errors.Is(err, ErrNoBinding) {
		return nil
	}
	if err != nil {
		return err
	}
	return errcode.New(errcode.SandboxLeased, "Sandbox %s already holds lease %s of generation %s of template %s; clone into a new sandbox.", sandboxID, b.Lease, b.Generation, b.Template)
}

// Release removes a lease record durably. The caller removed the clone's clone.json first,
// durably (RemoveBinding): a binding must never name a lease that is gone. If the generation
// is to be retired when drained and this was its last lease, the retirement finishes; if its
// template is being deleted and this was its last generation, the template goes too. A lease,
// generation or template that is already gone is not an error: a retirement may have swept
// the record once the binding was gone.
func (s *Store) Release(ctx context.Context, name, gen, leaseID string) error {
	if err := validRelease(name, gen, leaseID); err != nil {
		return err
	}
	return s.withLock(ctx, func(tx *Tx) error { return tx.Release(name, gen, leaseID) })
}

func validRelease(name, gen, leaseID string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := ValidateGeneration(gen); err != nil {
		return err
	}
	return ValidateLeaseID(leaseID)
}

// Release is Store.Release under a lock the caller holds.
func (tx *Tx) Release(name, gen, leaseID string) (err error) {
	defer func() { err = tx.s.storage(err) }()
	if err := tx.check(); err != nil {
		return err
	}
	if err := validRelease(name, gen, leaseID); err != nil {
		return err
	}
	s := tx.s
	tdir, rec, err := s.openTemplate(name)
	if errcode.Of(err) == errcode.TemplateNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	defer tdir.Close()
	gdir, err := platform.OpenDirAt(tdir, gen)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer gdir.Close()
	if ldir, err := platform.OpenDirAt(gdir, LeasesDir); err == nil {
		err = s.removeEntry(ldir, leaseID+leaseExt, StepLeaseRemove)
		ldir.Close()
		if err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	g, found, err := loadGeneration(tdir, gen)
	if err != nil || !found {
		return err
	}
	if g.tomb == nil || !g.tomb.Drain || len(g.leases) > 0 {
		return nil
	}
	if err := s.finishRetire(tdir, name, gen); err != nil {
		return fmt.Errorf("template: the lease was released, but finishing the drained retirement of %s/%s failed: %w", name, gen, err)
	}
	if rec.Deleting {
		gens, err := generationNames(tdir)
		if err != nil {
			return err
		}
		if len(gens) == 0 {
			return s.removeTemplate(tdir, name)
		}
	}
	return nil
}

// BindingChecker returns the bindingExists function that Retire, DeleteTemplate and Check
// take: it reads the clone binding in the state directory that dirOf names for a sandbox and
// reports whether it names the lease. It answers false only when it knows the binding is gone
// or names another lease (the sandbox's directory or its clone.json is missing, or the binding
// names another lease), and true when it cannot tell (an unreadable binding, a bad id), so
// that a lease is never swept on a doubt.
func BindingChecker(dirOf func(sandboxID string) (string, error)) func(sandboxID, leaseID string) bool {
	return func(sandboxID, leaseID string) bool {
		dir, err := dirOf(sandboxID)
		if err != nil {
			return true
		}
		b, err := ReadBinding(dir)
		if errors.Is(err, ErrNoBinding) {
			return false
		}
		if err != nil {
			return true
		}
		return b.Lease == leaseID
	}
}
