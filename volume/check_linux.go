//go:build linux

package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/bothy/bothy/platform"
)

// The kinds of problems [Store.Check] reports.
const (
	ProblemHalfMade      = "volume-half-made"      // a record in state creating, or a directory without one
	ProblemDeleting      = "volume-deleting"       // a delete that did not finish
	ProblemImageMissing  = "volume-image-missing"  // a ready record without its image
	ProblemUnmounted     = "volume-unmounted"      // a ready volume not mounted on the host
	ProblemStaleHold     = "volume-stale-hold"     // a hold whose sandbox is gone or does not name it
	ProblemLeftoverMount = "volume-leftover-mount" // a host mount below volumes/ that no ready volume has
	ProblemLeftoverLoop  = "volume-leftover-loop"  // a loop device backed by an image no ready volume has
)

// Problem is one thing [Store.Check] found, with the entry at fault relative to the volumes
// directory.
type Problem struct {
	Kind   string
	Entry  string
	Detail string
}

// Check looks at every volume and, with repair, fixes what it found (under the store's
// lock, so beside a running server too): removes half-made volumes, finishes deletes, mounts
// ready volumes, drops stale holds, detaches leftover mounts (their loop devices then clear
// themselves). A ready record whose image is gone is removed with its holds: the volume's
// data is lost already, and the record would refuse every sandbox that names it.
func (s *Store) Check(repair bool) ([]Problem, error) {
	return s.check(repair)
}

func (s *Store) check(repair bool) (out []Problem, err error) {
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	names, err := s.names()
	if err != nil {
		return nil, err
	}
	ready := map[string]bool{}
	var errs []error
	fix := func(fn func() error) {
		if repair {
			if err := fn(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, name := range names {
		p, ok := s.checkVolume(name, fix)
		out = append(out, p...)
		ready[name] = ok
	}
	points, err := platform.MountsUnder(s.dir)
	if err != nil {
		return out, err
	}
	for _, mp := range points {
		rest, _ := strings.CutPrefix(mp, s.dir+"/")
		name, sub, _ := strings.Cut(rest, "/")
		if ready[name] && sub == MountName {
			continue
		}
		out = append(out, Problem{ProblemLeftoverMount, rest, "a host mount below the volumes directory that no ready volume has"})
		fix(func() error { return platform.UnmountUnder(mp) })
	}
	loops, err := platform.LoopBackingFiles()
	if err == nil {
		for dev, back := range loops {
			rest, ok := strings.CutPrefix(back, s.dir+"/")
			if !ok {
				continue
			}
			name, sub, _ := strings.Cut(rest, "/")
			if ready[name] && sub == ImageName {
				continue
			}
			// Not repaired by itself: the device clears itself once the mount that holds
			// it goes (a leftover mount above, or a sandbox's namespace).
			out = append(out, Problem{ProblemLeftoverLoop, rest, fmt.Sprintf("loop device %s is backed by an image that no ready volume has", dev)})
		}
	}
	return out, errors.Join(errs...)
}

// checkVolume checks one entry of the volumes directory (fixing what it found through fix)
// and reports whether it is a ready volume.
func (s *Store) checkVolume(name string, fix func(func() error)) (out []Problem, ready bool) {
	if _, tmp := platform.IsTempName(name); tmp || CheckName(name) != nil {
		out = append(out, Problem{ProblemHalfMade, name, "an entry of the volumes directory that is no volume's"})
		fix(func() error { return s.teardown(name) })
		return out, false
	}
	v, rerr := s.readRecord(name)
	switch {
	case rerr != nil:
		// A record that does not read is left to the operator: it may be a volume's.
		out = append(out, Problem{ProblemHalfMade, filepath.Join(name, RecordName), fmt.Sprintf("the record does not read: %v", rerr)})
		return out, false
	case v == nil || v.State == StateCreating:
		out = append(out, Problem{ProblemHalfMade, name, "a volume whose create did not finish"})
		fix(func() error { return s.teardown(name) })
		return out, false
	case v.State == StateDeleting:
		out = append(out, Problem{ProblemDeleting, name, "a volume whose delete did not finish"})
		fix(func() error { return s.teardown(name) })
		return out, false
	}
	if fi, err := os.Lstat(s.ImagePath(name)); err != nil || !fi.Mode().IsRegular() {
		out = append(out, Problem{ProblemImageMissing, filepath.Join(name, ImageName), "a ready volume's record without its image; its files are lost"})
		fix(func() error { return s.teardown(name) })
		return out, false
	}
	if ok, err := s.mounted(name); err == nil && !ok {
		out = append(out, Problem{ProblemUnmounted, filepath.Join(name, MountName), "a ready volume that is not mounted on the host"})
		fix(func() error { return s.mount(name) })
	}
	if holds, err := s.holds(name); err == nil {
		for _, id := range holds {
			if s.heldBy != nil && !s.heldBy(id, name) {
				out = append(out, Problem{ProblemStaleHold, filepath.Join(name, HoldsName, id), "a hold whose sandbox is gone or does not mount the volume"})
				fix(func() error {
					err := os.Remove(filepath.Join(s.dir, name, HoldsName, id))
					if errors.Is(err, fs.ErrNotExist) {
						return nil
					}
					return err
				})
			}
		}
	}
	return out, true
}
