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

// The outbox holds the tombstones and retirements made on this node that the template
// registry (store/template/registry) has yet to record for the other nodes. Each is
// recorded here before the node's own tombstone or retirement is made, and removed once the
// registry holds it; so a crash, a registry that is down or a push that failed leaves the
// record, and bothyd's start-up, its periodic sweep and `bothyd check --repair` push it again.
//
// A record is an intent, not a fact: the generation's state in this store says whether the
// change it announces was made. One whose generation is still here and active was never
// made (the node died, or the change was refused, before it), and is dropped unpushed.
const (
	// OutboxDir is the outbox, directly under TemplatesDir. Its name is not a valid
	// template name, so no template can take it.
	OutboxDir = "registry-outbox.d"
	// OutboxFormat is the format of an outbox record.
	OutboxFormat = 1
	outboxExt    = ".json"
)

// The durable steps of the outbox, reported to Options.OnSync.
const (
	StepOutboxWrite  = "outbox:write"  // an outbox record written
	StepOutboxRemove = "outbox:remove" // an outbox record removed (pushed, or dropped)
)

// RemoteTombstone is a tombstone (Retire false) or retirement of a generation made on this
// node that the template registry is to record.
type RemoteTombstone struct {
	Format     int       `json:"format"`
	Template   string    `json:"template"`
	Generation string    `json:"generation"`
	Retire     bool      `json:"retire"`
	At         time.Time `json:"at"`
}

// outboxName is the record's file name: "<template>.<generation>.json" (a template name has
// no dot, so the name is unambiguous).
func outboxName(tmpl, gen string) string { return tmpl + "." + gen + outboxExt }

// parseOutboxName is the inverse of outboxName; false for any other name.
func parseOutboxName(n string) (tmpl, gen string, ok bool) {
	base, found := strings.CutSuffix(n, outboxExt)
	if !found {
		return "", "", false
	}
	tmpl, gen, found = strings.Cut(base, ".")
	if !found || ValidateName(tmpl) != nil || ValidateGeneration(gen) != nil {
		return "", "", false
	}
	return tmpl, gen, true
}

// openOutbox opens the outbox directory, creating it when create is set; nil and no error
// when it is missing and create is not.
func (s *Store) openOutbox(create bool) (*os.File, error) {
	if create {
		if err := s.opts.FS.MkdirAt(s.dir, OutboxDir, 0o700); err == nil {
			if err := s.opts.FS.SyncDir(s.dir); err != nil {
				return nil, err
			}
		} else if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("template: create %s: %w", OutboxDir, err)
		}
	}
	d, err := platform.OpenDirAt(s.dir, OutboxDir)
	if errors.Is(err, fs.ErrNotExist) && !create {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("template: %s must be a directory, not a link: %w", OutboxDir, err)
	}
	return d, nil
}

// RecordRemoteTombstone records durably, under the store's lock, that the template registry
// is to record a tombstone (retire false) or retirement of the generation. Callers record it
// before they make the change here. A retirement's record is never replaced by a
// tombstone's: the retirement is the stronger.
func (s *Store) RecordRemoteTombstone(ctx context.Context, tmpl, gen string, retire bool) error {
	if err := ValidateName(tmpl); err != nil {
		return err
	}
	if err := ValidateGeneration(gen); err != nil {
		return err
	}
	return s.withLock(ctx, func(tx *Tx) error {
		d, err := s.openOutbox(true)
		if err != nil {
			return err
		}
		defer d.Close()
		if !retire {
			if old, found, err := readOutboxRecord(d, outboxName(tmpl, gen)); err == nil && found && old.Retire {
				return nil
			}
		}
		rec := RemoteTombstone{Format: OutboxFormat, Template: tmpl, Generation: gen, Retire: retire, At: time.Now().UTC()}
		return s.writeRecord(d, outboxName(tmpl, gen), rec, StepOutboxWrite)
	})
}

// RemoteTombstones are the outbox's records, oldest first. A record that does not read is
// skipped here (Check reports it).
func (s *Store) RemoteTombstones() (_ []RemoteTombstone, err error) {
	defer func() { err = s.storage(err) }()
	d, err := s.openOutbox(false)
	if err != nil || d == nil {
		return nil, err
	}
	defer d.Close()
	names, err := platform.ReadDirNames(d)
	if err != nil {
		return nil, err
	}
	var out []RemoteTombstone
	for _, n := range names {
		if _, _, ok := parseOutboxName(n); !ok {
			continue
		}
		rec, found, err := readOutboxRecord(d, n)
		if err != nil || !found {
			continue
		}
		out = append(out, *rec)
	}
	slices.SortFunc(out, func(a, b RemoteTombstone) int { return a.At.Compare(b.At) })
	return out, nil
}

// RemoteTombstoneDone removes the generation's outbox record, under the store's lock, once
// the registry holds what it announced: a retirement pushed settles either record, a
// tombstone pushed only a tombstone's (a retirement recorded meanwhile stays to be pushed).
// A missing record is not an error.
func (s *Store) RemoteTombstoneDone(ctx context.Context, tmpl, gen string, retire bool) error {
	if err := ValidateName(tmpl); err != nil {
		return err
	}
	if err := ValidateGeneration(gen); err != nil {
		return err
	}
	return s.withLock(ctx, func(tx *Tx) error {
		d, err := s.openOutbox(false)
		if err != nil || d == nil {
			return err
		}
		defer d.Close()
		n := outboxName(tmpl, gen)
		rec, found, err := readOutboxRecord(d, n)
		if err == nil && found && rec.Retire && !retire {
			return nil
		}
		return s.removeEntry(d, n, StepOutboxRemove)
	})
}

// RemoteTombstoneDue says whether an outbox record announces a change this store made: the
// generation is gone, tombstoned or retiring here. False when it is here and active, and
// the change was so never made (the record is then dropped unpushed).
func (s *Store) RemoteTombstoneDue(rec RemoteTombstone) (bool, error) {
	now, err := s.Now()
	if err != nil {
		return false, err
	}
	g, err := s.Generation(rec.Template, rec.Generation, now)
	if err != nil {
		if c := errcode.Of(err); c == errcode.TemplateNotFound || c == errcode.GenerationNotFound {
			return true, nil
		}
		return false, err
	}
	return g.State != StateActive, nil
}

func readOutboxRecord(d *os.File, n string) (*RemoteTombstone, bool, error) {
	data, found, err := readRecordFile(d, n)
	if err != nil || !found {
		return nil, found, err
	}
	rec, err := decodeOutbox(data)
	return rec, err == nil, err
}

func decodeOutbox(data []byte) (*RemoteTombstone, error) {
	var r RemoteTombstone
	if err := decodeRecord("outbox record", data, OutboxFormat, &r); err != nil {
		return nil, err
	}
	if ValidateName(r.Template) != nil || ValidateGeneration(r.Generation) != nil {
		return nil, badRecord("outbox record", "template %q, generation %q", clip(r.Template), clip(r.Generation))
	}
	return &r, nil
}

// checkOutbox reports the outbox's temp leftovers (removed with repair), its records that
// do not read and its foreign entries. Its records are work for bothyd, not problems.
func (s *Store) checkOutbox(repair bool) ([]Problem, error) {
	if st, err := platform.LstatAt(s.dir, OutboxDir); err == nil && !st.IsDir() {
		return []Problem{{Kind: ForeignEntry, Entry: OutboxDir, Detail: "the outbox is not a directory (a link, or a file): tombstones cannot be recorded for the template registry until it is removed"}}, nil
	}
	d, err := s.openOutbox(false)
	if err != nil || d == nil {
		return nil, err
	}
	defer d.Close()
	names, err := platform.ReadDirNames(d)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []Problem
	for _, n := range names {
		entry := OutboxDir + "/" + n
		if target, ok := platform.IsTempName(n); ok {
			if _, _, mine := parseOutboxName(target); mine {
				p := Problem{Kind: StagingLeftover, Entry: entry, Detail: "a temp file of an interrupted outbox write"}
				if repair {
					if err := s.removeEntry(d, n, StepCleanStaging); err != nil {
						return nil, err
					}
					p.Repaired = true
				}
				out = append(out, p)
				continue
			}
		}
		tmpl, gen, ok := parseOutboxName(n)
		if !ok {
			out = append(out, Problem{Kind: ForeignEntry, Entry: entry, Detail: "not an outbox record"})
			continue
		}
		if _, _, err := readOutboxRecord(d, n); err != nil {
			out = append(out, Problem{Kind: BadRecord, Template: tmpl, Generation: gen, Entry: entry, Detail: err.Error()})
		}
	}
	return out, nil
}

// cleanOutbox removes the outbox's temp leftovers (RemoveLeftovers' share).
func (s *Store) cleanOutbox() error {
	if st, err := platform.LstatAt(s.dir, OutboxDir); err != nil || !st.IsDir() {
		return nil // none, or foreign: check reports it
	}
	d, err := s.openOutbox(false)
	if err != nil || d == nil {
		return err
	}
	defer d.Close()
	return s.cleanTemps(d, func(target string) bool { _, _, ok := parseOutboxName(target); return ok })
}
