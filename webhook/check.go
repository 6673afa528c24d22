package webhook

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/bothy/bothy/platform"
)

// The kinds of problem [Check] reports.
const (
	// Leftover is what an interrupted write or delete left: a temporary file, or the outbox
	// of a webhook whose record is gone. Repair removes it.
	Leftover = "webhook-leftover"
	// BadRecord is a record that does not read: a webhook's, an outbox entry's or a delivery
	// state's. Repair never removes a record it cannot read; the operator looks at it.
	BadRecord = "webhook-bad-record"
	// ForeignEntry is a name in the webhooks' directory that bothyd never makes; kept.
	ForeignEntry = "webhook-foreign-entry"
	// MissingOutbox is a webhook whose outbox directory is gone; repair makes it anew.
	MissingOutbox = "webhook-missing-outbox"
)

// Problem is one inconsistency of the webhooks' records; Entry is relative to Root/webhooks.
type Problem struct {
	Kind     string
	Entry    string
	Detail   string
	Repaired bool
}

// Check judges the webhooks' records of root and, with repair, repairs what is safe to. While
// a server holds the lock (busy), it only reads, and does not report temporary files, which
// may be that server's writes in flight; the server's start-up cleans what is left.
func Check(root string, repair bool) (probs []Problem, busy bool, err error) {
	dir := filepath.Join(root, Dir)
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if !fi.IsDir() {
		return []Problem{{Kind: ForeignEntry, Entry: ".", Detail: "the webhooks' directory is not a directory (" + fi.Mode().Type().String() + ")"}}, false, nil
	}
	lf, err := platform.OpenFile(filepath.Join(dir, LockName), os.O_RDWR, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, false, err
	default:
		defer lf.Close()
		ok, err := platform.TryLock(lf)
		if err != nil {
			return nil, false, err
		}
		busy = !ok
	}
	probs, err = scan(dir, repair && !busy, nil)
	if busy {
		probs = slices.DeleteFunc(probs, func(p Problem) bool { return p.Kind == Leftover && isTemp(p.Entry) })
	}
	return probs, busy, err
}

func isTemp(entry string) bool {
	_, ok := platform.IsTempName(filepath.Base(entry))
	return ok
}

// scan reads the webhooks' directory, handing each usable webhook to load (when not nil), and
// with repair removes leftovers (and makes a missing outbox).
func scan(dir string, repair bool, load func(*hookRecord, []*entry, *deliveryState)) ([]Problem, error) {
	var probs []Problem
	add := func(kind, entry, detail string, fix func() error) {
		probs = append(probs, problem(kind, entry, detail, repair, fix))
	}
	names, err := platform.ListDir(dir)
	if err != nil {
		return nil, fmt.Errorf("webhook: list %s: %w", dir, err)
	}
	records := map[string]bool{} // by id: true when the record reads
	var good []*hookRecord
	var outboxes []string
	for _, name := range names {
		path := filepath.Join(dir, name)
		fi, err := os.Lstat(path)
		if err != nil {
			continue
		}
		if name == LockName {
			continue
		}
		if _, ok := platform.IsTempName(name); ok && fi.Mode().IsRegular() {
			add(Leftover, name, "a temporary file of an interrupted write", func() error { return os.Remove(path) })
			continue
		}
		if id, ok := hookIDOf(name); ok && fi.Mode().IsRegular() {
			rec, err := readRecord[hookRecord](dir, name, hookFormat)
			switch {
			case err != nil:
				records[id] = false
				add(BadRecord, name, fmt.Sprintf("the webhook's record does not read: %v; delete the file (and the webhook's outbox) to drop the webhook", err), nil)
			case rec.ID != id:
				records[id] = false
				add(BadRecord, name, fmt.Sprintf("the record names the webhook %q, not %q", rec.ID, id), nil)
			default:
				records[id] = true
				good = append(good, rec)
			}
			continue
		}
		if ValidID(name) && fi.IsDir() {
			outboxes = append(outboxes, name)
			continue
		}
		add(ForeignEntry, name, "bothyd never makes this name here; it is left alone", nil)
	}
	for _, id := range outboxes {
		if _, ok := records[id]; !ok {
			path := filepath.Join(dir, id)
			add(Leftover, id, "the outbox of a webhook whose record is gone (a delete was interrupted)", func() error { return os.RemoveAll(path) })
		}
	}
	for _, rec := range good {
		obox := filepath.Join(dir, rec.ID)
		if !slices.Contains(outboxes, rec.ID) {
			add(MissingOutbox, rec.ID, "the webhook's outbox directory is missing (a create was interrupted, or it was removed)", func() error {
				return platform.EnsureDir(dir, rec.ID, 0o700)
			})
			if !repair {
				continue
			}
		}
		entries, st, ps := scanOutbox(obox, rec.ID, repair)
		probs = append(probs, ps...)
		if load != nil {
			load(rec, entries, st)
		}
	}
	return probs, nil
}

// scanOutbox reads one webhook's outbox.
func scanOutbox(obox, id string, repair bool) ([]*entry, *deliveryState, []Problem) {
	var probs []Problem
	add := func(kind, name, detail string, fix func() error) {
		probs = append(probs, problem(kind, filepath.Join(id, name), detail, repair, fix))
	}
	d, err := platform.OpenDir(obox)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			add(BadRecord, "", fmt.Sprintf("the outbox cannot be read: %v", err), nil)
		}
		return nil, nil, probs
	}
	names, err := platform.ReadDirNames(d)
	d.Close()
	if err != nil {
		add(BadRecord, "", fmt.Sprintf("the outbox cannot be read: %v", err), nil)
		return nil, nil, probs
	}
	slices.Sort(names) // entry names sort as event ids do
	var entries []*entry
	var st *deliveryState
	for _, name := range names {
		path := filepath.Join(obox, name)
		fi, err := os.Lstat(path)
		if err != nil {
			continue
		}
		remove := func() error { return os.Remove(path) }
		if _, ok := platform.IsTempName(name); ok && fi.Mode().IsRegular() {
			add(Leftover, name, "a temporary file of an interrupted write", remove)
			continue
		}
		if name == StateName && fi.Mode().IsRegular() {
			s, err := readRecord[deliveryState](obox, name, stateFormat)
			if err != nil {
				add(BadRecord, name, fmt.Sprintf("the delivery state does not read: %v; remove it by hand to start its counters again", err), nil)
				continue
			}
			st = s
			continue
		}
		if seq, ok := parseEntryName(name); ok && fi.Mode().IsRegular() {
			e, err := readRecord[entry](obox, name, entryFormat)
			if err == nil && e.EventID != seq {
				err = fmt.Errorf("it names event %d", e.EventID)
			}
			if err != nil {
				add(BadRecord, name, fmt.Sprintf("an outbox entry does not read, so it is not delivered: %v; look at it, and remove it by hand", err), nil)
				continue
			}
			e.Body = nil // read again for each attempt (Manager.run)
			entries = append(entries, e)
			continue
		}
		add(ForeignEntry, name, "bothyd never makes this name in an outbox; it is left alone", nil)
	}
	return entries, st, probs
}

// problem is a Problem found at entry, repaired by fix when repair is asked for and fix is
// not nil; a repair that fails says why in the detail.
func problem(kind, entry, detail string, repair bool, fix func() error) Problem {
	p := Problem{Kind: kind, Entry: entry, Detail: detail}
	if repair && fix != nil {
		if err := fix(); err == nil {
			p.Repaired = true
		} else {
			p.Detail += fmt.Sprintf(" (repair failed: %v)", err)
		}
	}
	return p
}
