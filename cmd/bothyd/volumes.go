package main

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/bothy/bothy/check"
	"github.com/bothy/bothy/store"
	"github.com/bothy/bothy/supervisor"
	"github.com/bothy/bothy/volume"
)

// openVolumes opens the volume store of the state root and reconciles it (docs/volumes.md):
// half-made volumes go, interrupted deletes finish, ready volumes whose host mount is gone (a
// reboot) are mounted again. A failure here is logged, not fatal: the server still serves its
// sandboxes, and a volume that did not mount is mounted at its next use. Without a store
// (nil: another OS, or an unusable volumes directory) the volume routes answer
// not-implemented.
func openVolumes(root string, st *store.Store, log *slog.Logger) *volume.Store {
	vs, err := volume.Open(root)
	if err != nil {
		log.Error("volumes are off: their directory", "err", err)
		return nil
	}
	vs.SetHeldBy(supervisor.VolumeHeldBy(st))
	if err := vs.Recover(); err != nil {
		log.Error("reconciling the volumes at start-up; run bothyd check", "err", err)
	}
	return vs
}

// checkVolumes is bothyd check's look at the volumes (package volume's Check): it opens no
// store where the state root has no volumes directory.
func checkVolumes(root string) check.StoreCheck {
	return func(repair bool) ([]check.Problem, bool, error) {
		if _, err := os.Lstat(filepath.Join(root, volume.Dir)); errors.Is(err, fs.ErrNotExist) {
			return nil, false, nil
		}
		st, err := store.Open(root)
		if err != nil {
			return nil, false, err
		}
		defer st.Close()
		vs, err := volume.Open(root)
		if err != nil {
			return nil, false, err
		}
		vs.SetHeldBy(supervisor.VolumeHeldBy(st))
		probs, err := vs.Check(repair)
		out := make([]check.Problem, 0, len(probs))
		for _, p := range probs {
			out = append(out, check.Problem{Kind: p.Kind, Entry: filepath.Join(volume.Dir, p.Entry), Detail: p.Detail})
		}
		return out, false, err
	}
}
