package secret

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
)

// The kinds of problem [Check] reports.
const (
	// Leftover is a temporary file of an interrupted write. Repair removes it.
	Leftover = "secret-leftover"
	// BadRecord is a record that does not read, or a key file of the wrong size. Repair never
	// removes it: the operator looks at it (a lost key loses every value).
	BadRecord = "secret-bad-record"
	// MissingKey is a secret's record with no key file beside it: its value cannot be opened.
	// Repair leaves it; delete the record and create the secret again.
	MissingKey = "secret-missing-key"
	// ForeignEntry is a name in the secrets' directory that bothyd never makes; kept.
	ForeignEntry = "secret-foreign-entry"
)

// Problem is one inconsistency of the secrets' records; Entry is relative to Root/secrets.
type Problem struct {
	Kind     string
	Entry    string
	Detail   string
	Repaired bool
}

// Check judges the secrets' records of root and, with repair, removes the temporary files of
// interrupted writes. A running server makes its writes under its own lock-free durable
// writes, so a temporary file may be one in flight; the harm of removing it is a create that
// fails and is repeated, so Check does what the start-up does.
func Check(root string, repair bool) ([]Problem, error) {
	dir := filepath.Join(root, Dir)
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []Problem{{Kind: ForeignEntry, Entry: ".", Detail: "the secrets' directory is not a directory (" + fi.Mode().Type().String() + ")"}}, nil
	}
	probs, _, err := scan(dir, repair, nil)
	return probs, err
}

// scan reads the secrets' directory, handing each usable record to load (when not nil), and
// with repair removes leftovers. It returns the key, nil when there is none.
func scan(dir string, repair bool, load func(*rec)) ([]Problem, []byte, error) {
	var probs []Problem
	add := func(kind, entry, detail string, fix func() error) {
		p := Problem{Kind: kind, Entry: entry, Detail: detail}
		if repair && fix != nil {
			if err := fix(); err == nil {
				p.Repaired = true
			} else {
				p.Detail += fmt.Sprintf(" (repair failed: %v)", err)
			}
		}
		probs = append(probs, p)
	}
	names, err := platform.ListDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("secret: list %s: %w", dir, err)
	}
	var key []byte
	var recs []*rec
	for _, name := range names {
		path := filepath.Join(dir, name)
		fi, err := os.Lstat(path)
		if err != nil {
			continue
		}
		if _, ok := platform.IsTempName(name); ok && fi.Mode().IsRegular() {
			add(Leftover, name, "a temporary file of an interrupted write", func() error { return os.Remove(path) })
			continue
		}
		if name == KeyName && fi.Mode().IsRegular() {
			k, err := platform.ReadFile(path, keySize+1)
			if err == nil && len(k) != keySize {
				err = fmt.Errorf("it has %d bytes, not %d", len(k), keySize)
			}
			if err != nil {
				add(BadRecord, name, fmt.Sprintf("the secrets' key does not read: %v; without it no value opens", err), nil)
				continue
			}
			key = k
			continue
		}
		if n, ok := strings.CutSuffix(name, recordExt); ok && ValidName(n) && fi.Mode().IsRegular() {
			data, err := platform.ReadFile(path, record.MaxSize)
			r := new(rec)
			if err == nil {
				err = record.Decode(name, data, recordFormat, r)
			}
			if err == nil && r.Name != n {
				err = fmt.Errorf("it names the secret %q", r.Name)
			}
			if err != nil {
				add(BadRecord, name, fmt.Sprintf("the secret's record does not read: %v; delete the file and create the secret again", err), nil)
				continue
			}
			recs = append(recs, r)
			continue
		}
		add(ForeignEntry, name, "bothyd never makes this name here; it is left alone", nil)
	}
	for _, r := range recs {
		if key == nil {
			add(MissingKey, r.Name+recordExt, "the secret's record has no key beside it, so its value cannot be opened; delete the file and create the secret again", nil)
			continue
		}
		if load != nil {
			load(r)
		}
	}
	return probs, key, nil
}
