package template

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// Imported is what an import knows of the generation it brings in: the records its origin
// made at capture, which the new generation keeps (its id too, so that a clone names it the
// same on every node).
type Imported struct {
	Key        Key
	Time       TimeContract
	CapturedAt time.Time
	PauseMS    int64
	// Source is the generation's lineage as its origin recorded it; nil when unknown.
	Source *Source
}

// Fill writes a generation's payload below payload, an empty directory of the staging
// directory that only this import holds, and returns the payload's size in bytes. It must
// flush what it wrote to stable storage before it returns nil.
type Fill func(ctx context.Context, payload *os.File) (int64, error)

// Import makes generation gen of template name from what fill writes, as a capture makes
// one: under the lock it reserves gen (creating the template if it does not exist, and
// raising template.json's counter past gen durably, so that a later local capture never
// reuses the id) and makes a staging directory it holds an flock on; fill runs without the
// lock; then the index entry is written into staging and the staging directory renamed to
// gen. The staging directory is the import's record: a crash leaves it, never a generation a
// clone could lease, and the next operation on the template or [Store.Check] removes it.
//
// Errors: generation-exists when the template has a generation gen already (or a capture or
// import of it finishes first), template-tombstoned while the template is being deleted.
func (s *Store) Import(ctx context.Context, name, gen string, in Imported, fill Fill) (_ *Generation, err error) {
	defer func() { err = s.storage(err) }()
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	n, ok := parseGeneration(gen)
	if !ok {
		return nil, ValidateGeneration(gen)
	}
	now, err := s.Now()
	if err != nil {
		return nil, err
	}
	var c *capture
	err = s.withLock(ctx, func(tx *Tx) error {
		if _, _, err := s.openTemplate(name); errcode.Of(err) == errcode.TemplateNotFound {
			if _, err := s.createLocked(name); err != nil && errcode.Of(err) != errcode.TemplateExists {
				return err
			}
		}
		var err error
		c, err = s.reserveIDLocked(name, gen, n)
		return err
	})
	if err != nil {
		if c != nil {
			c.close()
		}
		return nil, err
	}
	defer c.close()
	if err := s.opts.FS.MkdirAt(c.sdir, PayloadDir, 0o755); err != nil {
		return nil, err
	}
	payload, err := platform.OpenDirAt(c.sdir, PayloadDir)
	if err != nil {
		return nil, err
	}
	size, err := fill(ctx, payload)
	payload.Close()
	if err != nil {
		return nil, err
	}
	if err := s.opts.FS.SyncDir(c.sdir); err != nil {
		return nil, err
	}
	s.synced(StepCaptureCopied)
	entry := &indexEntry{Format: IndexFormat, ID: gen, Template: name, Key: in.Key, Time: in.Time, CapturedAt: in.CapturedAt, SizeBytes: size, PauseMS: in.PauseMS, Source: in.Source}
	if err := s.writeRecord(c.sdir, IndexName, entry, StepCaptureIndex); err != nil {
		return nil, err
	}
	g, err := s.commit(ctx, c, entry, now)
	if errors.Is(err, fs.ErrExist) {
		return nil, generationExists(name, gen)
	}
	return g, err
}

func generationExists(name, gen string) error {
	return errcode.New(errcode.TemplateExists, "Template %s has a generation %s already; clone it, or retire it before bringing in another of that id.", name, gen)
}

// reserveIDLocked is reserveLocked for a given generation id: it refuses an id the template
// holds and raises the template's counter past it.
func (s *Store) reserveIDLocked(name, gen string, n uint64) (*capture, error) {
	d, rec, err := s.openTemplate(name)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if rec.Deleting {
		return nil, tombstoned(name)
	}
	if err := s.cleanTemplateDir(d, name); err != nil {
		return nil, err
	}
	if isDirAt(d, gen) {
		return nil, generationExists(name, gen)
	} else if _, err := platform.LstatAt(d, gen); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return nil, errcode.Wrap(errcode.Internal, err, "The entry of generation %s of template %s is not a directory; run bothyd check.", gen, name)
	}
	if rec.NextGeneration <= n {
		rec.NextGeneration = n + 1
		if err := s.writeRecord(d, TemplateRecordName, rec, ""); err != nil {
			return nil, err
		}
	}
	return s.stageLocked(d, name, gen, rec.UID)
}
