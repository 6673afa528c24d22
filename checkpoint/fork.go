package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
)

// A fork is a new sandbox whose chain holds the source's layers, hard-linked: a frozen layer
// is never written again (overlayfs writes to its upper only, and a first write to a lower
// file copies it up into a new inode), so its files can be shared by name in any number of
// sandboxes, and the file system's link count is each fork's lease on them: deleting the
// source, or a checkpoint of it, removes names, never the data a fork still names. A link
// costs an inode entry per file and directory, whatever the file's size.

// ext4 caps an inode at 65000 links, and every fork of a chain adds one to each of its
// files: a fork past it fails alone (EMLINK), as docs/checkpoints.md says.

// Point returns the layers that hold the sandbox's files now, top first, for forks to link,
// and the function that removes what Point made for them. A stopped sandbox (running false)
// rotates its upper into its chain (no copy, no checkpoint named); a running one is held
// (frozen) while its upper is copied into a staging layer, which done removes once the forks
// have linked it, and frozen is how long it was held.
func (s *Sandbox) Point(ctx context.Context, running bool, hold func() (func(), error)) (layers []string, frozen time.Duration, done func(), err error) {
	m, err := s.Manifest()
	if err != nil {
		return nil, 0, nil, err
	}
	if m.Pending != nil {
		return nil, 0, nil, pendingError()
	}
	if err := s.ensure(); err != nil {
		return nil, 0, nil, err
	}
	id := naming.RandomHex(8)
	done = func() {}
	// A chain at its bound is flattened into the staging copy, which the forks then stand
	// on alone.
	var flatten []string
	if len(m.Chain)+1 > MaxChain {
		flatten = m.Chain
	}
	if !running && !s.Disk && flatten == nil {
		if err := s.rotate(m, id, nil); err != nil {
			return nil, 0, nil, err
		}
	} else {
		if _, frozen, err = s.copyUpper(ctx, id, hold, flatten); err != nil {
			_ = os.RemoveAll(filepath.Join(s.root(), stagingPref+id))
			return nil, 0, nil, err
		}
		staging := filepath.Join(s.root(), stagingPref+id)
		layers = append(layers, staging)
		done = func() { _ = os.RemoveAll(staging) }
		if flatten != nil {
			return layers, frozen, done, nil
		}
	}
	for _, l := range m.Chain {
		layers = append(layers, s.LayerDir(l))
	}
	return layers, frozen, done, nil
}

// Adopt makes the layers (top first; another sandbox's, or a generation's payload) the chain
// of this sandbox, a new one with no upper yet, by hard links (see above). Its caller makes
// the sandbox's creation all or nothing across a crash (the supervisor's create.pending):
// Adopt records nothing before it links.
func (s *Sandbox) Adopt(layers []string) error {
	if err := s.ensure(); err != nil {
		return err
	}
	m := &Manifest{Format: Format}
	for _, src := range layers {
		id := naming.RandomHex(8)
		if err := LinkLayer(src, s.LayerDir(id)); err != nil {
			return err
		}
		m.Chain = append(m.Chain, id)
	}
	if err := platform.SyncDirPath(filepath.Join(s.root(), layersName)); err != nil {
		return err
	}
	s.crash("fork-linked")
	return s.write(m)
}

func pendingError() error {
	return errcode.New(errcode.TransitionInProgress, "A checkpoint operation of this sandbox was interrupted and is being finished; retry.")
}
