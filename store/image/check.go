package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/bothy/bothy/platform"
)

// ProblemKind names an inconsistency that Check finds.
type ProblemKind string

const (
	// A layer directory under a temporary name that no live unpacker or remover holds: a
	// pull or import died while unpacking it, or a deletion while removing it. Repair
	// removes it.
	HalfUnpacked ProblemKind = "half-unpacked-layer"
	// A whole layer that no image record names: one a live pull or import has just
	// unpacked, one a failed pull or import left (a retry finds it present), or one of an
	// image deleted while a pull or import ran (a deletion otherwise removes its layers).
	// Nothing is inconsistent: bothyd check notes it rather than failing. Repair removes it
	// while no pull or import runs.
	UnreferencedLayer ProblemKind = "unreferenced-layer"
	// A layer directory under its final name whose record does not read or names another
	// diff id: no step of this store leaves one. Repair removes it (a pull or import of an
	// image that needs it unpacks it anew).
	BadLayer ProblemKind = "bad-layer"
	// An image record that names a layer the store does not hold whole. Not repaired:
	// pulling or importing the image again restores the layer.
	MissingLayer ProblemKind = "missing-layer"
	// A leftover of a dead write, pull or import: a record's temporary file, a spool
	// directory, a work lock nobody holds. Repair removes it.
	StagingLeftover ProblemKind = "staging-leftover"
	// An image record that does not read. Never repaired.
	BadRecord ProblemKind = "bad-record"
	// An entry the image store does not own. Never repaired: it is not ours to remove.
	ForeignEntry ProblemKind = "foreign-entry"
	// A reference that does not read, or a reference to an image that has no record (no
	// step of this store leaves one: a reference is written only to an image that exists,
	// and an image is deleted only without references). Repair removes it.
	BadUse ProblemKind = "bad-image-reference"
)

// Problem is one inconsistency found by Check.
type Problem struct {
	Kind  ProblemKind
	Image string
	Layer string // a diff id
	// Entry is the path of the entry at fault, relative to the store's directory.
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

// Check looks for inconsistencies in the image store under its lock and, with repair,
// repairs those that are safe to repair (see the ProblemKind constants). While a pull or an
// import is live (its work lock is held), no layer is removed: a layer it has just unpacked
// is referenced by no record yet, and one it is unpacking may not be locked yet. Such
// problems are reported, not repaired, and the next Check repairs them.
func (s *Store) Check(ctx context.Context, repair bool) ([]Problem, error) {
	tx, err := s.Lock(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Unlock()
	out, live, err := s.checkWork(repair)
	if err != nil {
		return nil, err
	}
	ps, referenced, err := s.checkRefs(repair)
	if err != nil {
		return nil, err
	}
	out = append(out, ps...)
	ps, err = s.checkLayers(referenced, repair && live == 0)
	if err != nil {
		return nil, err
	}
	if live > 0 {
		for i := range ps {
			ps[i].Detail += fmt.Sprintf("; not removed while %d pull or import runs", live)
		}
	}
	out = append(out, ps...)
	ps, err = s.checkUses(repair)
	if err != nil {
		return nil, err
	}
	out = append(out, ps...)
	ps, err = s.checkTop()
	return append(out, ps...), err
}

// checkUses reports references that do not read and references to images without a record.
// Whether the user a reference names still exists is the caller's question (bothyd check
// asks the sandbox and template stores).
func (s *Store) checkUses(repair bool) ([]Problem, error) {
	names, err := platform.ReadDirNames(s.uses)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []Problem
	for _, n := range names {
		entry := filepath.Join(UsesDir, n)
		if ValidateName(n) != nil {
			out = append(out, Problem{Kind: ForeignEntry, Entry: entry, Detail: "not a valid image name"})
			continue
		}
		_, gerr := readImage(s.refs, n)
		dir, err := platform.OpenDirAt(s.uses, n)
		if err != nil {
			out = append(out, Problem{Kind: ForeignEntry, Entry: entry, Detail: "not a directory"})
			continue
		}
		files, err := platform.ReadDirNames(dir)
		if err != nil {
			dir.Close()
			return nil, err
		}
		for _, f := range files {
			p := Problem{Kind: BadUse, Image: n, Entry: filepath.Join(entry, f)}
			if _, err := readUse(dir, n, f); err != nil {
				p.Detail = fmt.Sprintf("the reference does not read: %v", err)
			} else if gerr != nil {
				p.Detail = "a reference to an image that has no record"
			} else {
				continue
			}
			if repair && platform.UnlinkAt(dir, f) == nil {
				p.Repaired = true
			}
			out = append(out, p)
		}
		if repair && (len(files) == 0 || gerr != nil) {
			_ = platform.RmdirAt(s.uses, n) // empty, or emptied above: nothing to keep
		}
		dir.Close()
	}
	return out, nil
}

// checkTop reports foreign entries in the store's directory.
func (s *Store) checkTop() ([]Problem, error) {
	names, err := platform.ReadDirNames(s.dir)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []Problem
	for _, n := range names {
		switch n {
		case LockName, LayersDir, RefsDir, WorkDir, StagingDir, UsesDir:
			continue
		}
		out = append(out, Problem{Kind: ForeignEntry, Entry: n, Detail: "not an entry of the image store"})
	}
	return out, nil
}

// held reports whether someone holds an flock on the entry name of dir (a work lock file or
// a temporary layer directory).
func held(dir *os.File, name string, isDir bool) (bool, error) {
	var f *os.File
	var err error
	if isDir {
		f, err = platform.OpenDirAt(dir, name)
	} else {
		f, err = platform.OpenFileAt(dir, name, os.O_RDONLY, 0)
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	defer f.Close() // releases the probe's own lock
	got, err := platform.TryLock(f)
	return !got, err
}

// checkWork reports the work locks nobody holds and the spool directories of dead imports,
// and counts the live pulls and imports.
func (s *Store) checkWork(repair bool) (out []Problem, live int, err error) {
	names, err := platform.ReadDirNames(s.work)
	if err != nil {
		return nil, 0, err
	}
	slices.Sort(names)
	liveKeys := make(map[string]bool)
	for _, n := range names {
		key, ok := strings.CutSuffix(n, ".lock")
		if !ok {
			out = append(out, Problem{Kind: ForeignEntry, Entry: WorkDir + "/" + n, Detail: "not a work lock"})
			continue
		}
		h, err := held(s.work, n, false)
		if err != nil {
			out = append(out, Problem{Kind: ForeignEntry, Entry: WorkDir + "/" + n, Detail: err.Error()})
			continue
		}
		if h {
			live++
			liveKeys[key] = true
			continue
		}
		p := Problem{Kind: StagingLeftover, Entry: WorkDir + "/" + n, Detail: "the work lock of a pull or import that ended", Repaired: repair}
		if repair {
			if err := platform.UnlinkAt(s.work, n); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, 0, err
			}
		}
		// A pull's lock is left for the next pull of its ref; only an import's lock
		// left over is a sign of a crash worth reporting.
		if strings.HasPrefix(key, "import-") {
			out = append(out, p)
		}
	}
	staged, err := platform.ReadDirNames(s.stage)
	if err != nil {
		return nil, 0, err
	}
	slices.Sort(staged)
	for _, n := range staged {
		if liveKeys[n] {
			continue
		}
		p := Problem{Kind: StagingLeftover, Entry: StagingDir + "/" + n, Detail: "the spool of an import that did not finish", Repaired: repair}
		if repair {
			if err := os.RemoveAll(filepath.Join(s.stage.Name(), n)); err != nil {
				return nil, 0, err
			}
		}
		out = append(out, p)
	}
	return out, live, nil
}

// checkRefs reads every image record and returns the diff ids they reference.
func (s *Store) checkRefs(repair bool) ([]Problem, map[string][]string, error) {
	names, err := platform.ReadDirNames(s.refs)
	if err != nil {
		return nil, nil, err
	}
	slices.Sort(names)
	var out []Problem
	referenced := make(map[string][]string)
	for _, n := range names {
		entry := RefsDir + "/" + n
		if target, ok := platform.IsTempName(n); ok && strings.HasSuffix(target, refExt) {
			p := Problem{Kind: StagingLeftover, Entry: entry, Detail: "left by a write that did not finish", Repaired: repair}
			if repair {
				if err := platform.UnlinkAt(s.refs, n); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return nil, nil, err
				}
			}
			out = append(out, p)
			continue
		}
		name, ok := strings.CutSuffix(n, refExt)
		if !ok || ValidateName(name) != nil {
			out = append(out, Problem{Kind: ForeignEntry, Entry: entry, Detail: "not an image record"})
			continue
		}
		img, err := readImage(s.refs, name)
		if err != nil {
			out = append(out, Problem{Kind: BadRecord, Image: name, Entry: entry, Detail: err.Error()})
			continue
		}
		for _, d := range img.Layers {
			referenced[d] = append(referenced[d], name)
		}
	}
	return out, referenced, nil
}

// checkLayers reports half-unpacked, bad and unreferenced layers (removing them with
// repair) and the layers that records reference but the store does not hold.
func (s *Store) checkLayers(referenced map[string][]string, repair bool) ([]Problem, error) {
	names, err := platform.ReadDirNames(s.layers)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []Problem
	whole := make(map[string]bool)
	for _, n := range names {
		entry := LayersDir + "/" + Algorithm + "/" + n
		p, err := s.checkLayer(n, referenced, whole)
		if err != nil {
			return nil, err
		}
		if p == nil {
			continue
		}
		p.Entry = entry
		if repair && p.Kind != ForeignEntry {
			if err := os.RemoveAll(filepath.Join(s.layers.Name(), n)); err != nil {
				return nil, err
			}
			p.Repaired = true
		}
		out = append(out, *p)
	}
	ids := make([]string, 0, len(referenced))
	for d := range referenced {
		ids = append(ids, d)
	}
	slices.Sort(ids)
	for _, d := range ids {
		if !whole[d] {
			out = append(out, Problem{Kind: MissingLayer, Layer: d, Image: strings.Join(referenced[d], ","),
				Entry: LayersDir + "/" + strings.Replace(d, ":", "/", 1), Detail: "images " + strings.Join(referenced[d], ", ") + " need this layer; pull or import them again"})
		}
	}
	return out, nil
}

// checkLayer judges one entry of layers/sha256; whole collects the whole layers.
func (s *Store) checkLayer(n string, referenced map[string][]string, whole map[string]bool) (*Problem, error) {
	st, err := platform.LstatAt(s.layers, n)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if target, ok := platform.IsTempName(n); ok && isHex64(target) && st.IsDir() {
		h, err := held(s.layers, n, true)
		if err != nil || h {
			return nil, err // a live unpacker's
		}
		return &Problem{Kind: HalfUnpacked, Layer: Algorithm + ":" + target, Detail: "a layer whose unpacking or removal did not finish"}, nil
	}
	if !isHex64(n) || !st.IsDir() {
		return &Problem{Kind: ForeignEntry, Detail: "not a layer directory"}, nil
	}
	diffID := Algorithm + ":" + n
	if _, ok := s.presentLayer(n); !ok {
		return &Problem{Kind: BadLayer, Layer: diffID, Detail: "a layer directory whose record does not read"}, nil
	}
	whole[diffID] = true
	if len(referenced[diffID]) == 0 {
		return &Problem{Kind: UnreferencedLayer, Layer: diffID, Detail: "a layer no image uses"}, nil
	}
	return nil, nil
}
