package template

import (
	"errors"
	"os"
	"syscall"

	"github.com/bothy/bothy/platform"
)

// isNotEmpty reports whether a removal of a directory failed because it is not empty.
func isNotEmpty(err error) bool {
	return errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)
}

// retireOnFullDisk retires the untombstoned generation g when its tombstone cannot be written
// because the disk is full (tombErr): deleting a template is how a user frees space, so it
// must not need any. It sweeps the stale leases (unlinks); if leases remain, the generation
// must stay for its clones, quarantined by a tombstone that cannot be written now, so it
// fails with tombErr (storage-full) and changes nothing else. Otherwise it quarantines the
// generation by removing its index entry first (an unlink): a generation without an index
// entry is never leased or selected, whatever else its directory holds, so the payload may go
// next without a tombstone. An interruption leaves a payload without an index entry, which
// Check reports and its repair, or retiring again, finishes.
func (s *Store) retireOnFullDisk(tdir *os.File, name string, g *genState, bindingExists func(sandboxID, leaseID string) bool, tombErr error) ([]Lease, error) {
	gdir, err := platform.OpenDirAt(tdir, g.id)
	if err != nil {
		return nil, errors.Join(tombErr, err)
	}
	defer gdir.Close()
	leases, err := s.sweepLeases(gdir, g, bindingExists)
	if err != nil {
		return nil, errors.Join(tombErr, err)
	}
	if len(leases) > 0 {
		return nil, tombErr
	}
	if err := s.removeEntry(gdir, IndexName, StepRetireIndex); err != nil {
		return nil, errors.Join(tombErr, err)
	}
	return nil, s.finishRetire(tdir, name, g.id)
}
