package template

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
)

// Template is the view of one template.
type Template struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// Generations counts the template's generations in any state.
	Generations int `json:"generations"`
	// Latest is the newest active, eligible generation (of any key), or "".
	Latest string `json:"latest,omitempty"`
	// Deleting is set while a draining delete waits for the last lease.
	Deleting bool `json:"-"`
}

// CreateTemplate creates an empty template (template-exists if it exists, also while a
// draining delete is finishing it).
func (s *Store) CreateTemplate(ctx context.Context, name string) (*Template, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	var out *Template
	err := s.withLock(ctx, func(tx *Tx) (err error) {
		out, err = s.createLocked(name)
		return err
	})
	return out, err
}

// createLocked is CreateTemplate under the lock.
func (s *Store) createLocked(name string) (_ *Template, err error) {
	made := false
	if err := s.opts.FS.MkdirAt(s.dir, name, 0o700); err == nil {
		made = true
	} else if !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	defer func() {
		// A create that fails leaves no directory it made: an empty template directory
		// is what Check calls an interrupted delete. (writeRecord removed the record if
		// it landed.) Removing it if empty is harmless: nothing else makes one under
		// the lock we hold.
		if err != nil && made {
			if rerr := s.removeDir(s.dir, name, ""); rerr != nil && !isNotEmpty(rerr) {
				err = errors.Join(err, rerr)
			}
		}
	}()
	// The new directory entry must be durable before the record inside it is.
	if err := s.opts.FS.SyncDir(s.dir); err != nil {
		return nil, err
	}
	tdir, found, err := s.openTemplateDir(name)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errors.New("template: the template directory vanished under the lock")
	}
	defer tdir.Close()
	if rec, err := readTemplateRecord(tdir); err != nil {
		return nil, err
	} else if rec != nil {
		return nil, errcode.New(errcode.TemplateExists, "Template %s already exists; choose another name or delete it first.", name)
	}
	if err := s.cleanTemplateDir(tdir, name); err != nil {
		return nil, err
	}
	// A directory without a record holds no generations (the record goes after the last
	// one); if it does, something other than this store made them.
	if gens, err := generationNames(tdir); err != nil {
		return nil, err
	} else if len(gens) > 0 {
		return nil, errcode.New(errcode.Internal, "The directory of template %s holds generations (%s) but no template record; run bothyd check.", name, strings.Join(gens, ", "))
	}
	rec := &templateRecord{Format: TemplateFormat, Name: name, UID: randomUID(), CreatedAt: time.Now().UTC(), NextGeneration: 1}
	if err := s.writeRecord(tdir, TemplateRecordName, rec, StepTemplateCreate); err != nil {
		return nil, err
	}
	return &Template{Name: name, CreatedAt: rec.CreatedAt}, nil
}

// Templates lists the templates, sorted by name, as views at the host time now. It reads
// without the lock. Entries of the templates directory that are not template directories are
// skipped (Check reports them).
func (s *Store) Templates(now TimeContract) (_ []Template, err error) {
	defer func() { err = s.storage(err) }()
	names, err := platform.ReadDirNames(s.dir)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	out := []Template{}
	for _, name := range names {
		if !naming.ValidID(name) || !isDirAt(s.dir, name) {
			continue // Check reports it
		}
		t, err := s.Template(name, now)
		if errcode.Of(err) == errcode.TemplateNotFound {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *t)
	}
	return out, nil
}

// Template returns the view of one template at the host time now (template-not-found).
func (s *Store) Template(name string, now TimeContract) (_ *Template, err error) {
	defer func() { err = s.storage(err) }()
	tdir, rec, err := s.openTemplate(name)
	if err != nil {
		return nil, err
	}
	defer tdir.Close()
	gens, err := s.loadAll(tdir)
	if err != nil {
		return nil, err
	}
	t := &Template{Name: name, CreatedAt: rec.CreatedAt, Generations: len(gens), Deleting: rec.Deleting}
	for i := len(gens) - 1; i >= 0; i-- {
		if v := s.view(name, gens[i], now); v.State == StateActive && v.Eligibility == Eligible {
			t.Latest = v.ID
			break
		}
	}
	return t, nil
}

// DeleteTemplate retires every generation of the template (see Retire) and then removes the
// template. When clones still lease generations, it fails with generation-leased naming the
// leases and changes nothing (all generations are counted before any is retired, under one
// hold of the lock), unless drain is set: then every leased generation is marked "retire when
// drained", the others are retired, the template takes no more captures, it returns Draining,
// and the release of the last lease removes the template. Retired means the template is gone.
func (s *Store) DeleteTemplate(ctx context.Context, name string, drain bool, bindingExists func(sandboxID, leaseID string) bool) (Outcome, error) {
	if err := ValidateName(name); err != nil {
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
		gens, err := generationNames(tdir)
		if err != nil {
			return err
		}
		var leased []Lease
		if !drain {
			for _, gen := range gens {
				_, ls, err := s.leasesOf(tdir, name, gen, bindingExists)
				if err != nil {
					return err
				}
				leased = append(leased, ls...)
			}
			if len(leased) > 0 {
				return leasedError(name, "", leased)
			}
		}
		for _, gen := range gens {
			ls, err := s.retire(tdir, name, gen, drain, bindingExists)
			if err != nil {
				return err
			}
			leased = append(leased, ls...)
		}
		if len(leased) > 0 {
			if !drain {
				return leasedError(name, "", leased)
			}
			if !rec.Deleting {
				rec.Deleting = true
				if err := s.writeRecord(tdir, TemplateRecordName, rec, StepTemplateUpdate); err != nil {
					return err
				}
			}
			out = Draining
			return nil
		}
		out = Retired
		return s.removeTemplate(tdir, name)
	})
	return out, err
}

// removeTemplate removes a template that has no generations left: its record (durably),
// then its directory. A capture still staging keeps the directory; it finds the template gone
// when it commits and removes its staging, and the directory with it.
func (s *Store) removeTemplate(tdir *os.File, name string) error {
	if err := s.removeEntry(tdir, TemplateRecordName, StepTemplateRemove); err != nil {
		return err
	}
	if err := s.cleanTemplateDir(tdir, name); err != nil {
		return err
	}
	return s.removeTemplateDirIfEmpty(tdir, name)
}

func (s *Store) removeTemplateDirIfEmpty(tdir *os.File, name string) error {
	// Only the directory this handle opened: a template made again meanwhile is left alone.
	st, err := platform.LstatAt(s.dir, name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	id, err := platform.IDOf(tdir)
	if err != nil || id != st.ID {
		return err
	}
	names, err := platform.ReadDirNames(tdir)
	if err != nil {
		return err
	}
	var foreign []string
	staging := false
	for _, n := range names {
		if target, ok := platform.IsTempName(n); ok && validGenerationName(target) {
			staging = true // a live capture's: it removes the directory when it ends
			continue
		}
		foreign = append(foreign, n)
	}
	if len(foreign) > 0 {
		slices.Sort(foreign)
		return errcode.New(errcode.ForeignFiles, "Template %s was removed, but its directory holds entries bothyd does not own (%s); they were kept, remove them by hand.", name, strings.Join(foreign, ", "))
	}
	if staging {
		return nil
	}
	return s.removeDir(s.dir, name, StepTemplateDir)
}

// cleanTemplateDir removes the leftovers of dead writes in a template's directory: temp files
// of template.json (every write of it is under the lock, which the caller holds) and staging
// directories of captures whose process is gone (a live capture holds an flock on its staging
// directory).
func (s *Store) cleanTemplateDir(tdir *os.File, name string) error {
	names, err := platform.ReadDirNames(tdir)
	if err != nil {
		return err
	}
	removed := false
	for _, n := range names {
		target, ok := platform.IsTempName(n)
		if !ok {
			continue
		}
		st, err := platform.LstatAt(tdir, n)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return err
		}
		switch {
		case target == TemplateRecordName && st.IsRegular():
			if err := s.opts.FS.UnlinkAt(tdir, n); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			removed = true
		case validGenerationName(target) && st.IsDir():
			dead, err := stagingDead(tdir, n)
			if err != nil {
				return err
			}
			if !dead {
				continue
			}
			if err := s.opts.FS.RemoveAllAt(tdir, n); err != nil {
				return err
			}
			removed = true
		}
	}
	if removed {
		if err := s.opts.FS.SyncDir(tdir); err != nil {
			return err
		}
		s.synced(StepCleanStaging)
	}
	return nil
}

func validGenerationName(s string) bool {
	_, ok := parseGeneration(s)
	return ok
}

// stagingDead reports whether no capture holds the staging directory name in tdir.
func stagingDead(tdir *os.File, name string) (bool, error) {
	d, err := platform.OpenDirAt(tdir, name)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	defer d.Close()
	got, err := platform.TryLock(d)
	if err != nil || !got {
		return false, err
	}
	// Closing d releases the probe's lock.
	return true, nil
}
