package supervisor

import (
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// A checkpoint of a running microVM (a [runtime.MemorySaver]'s sandbox) holds its memory as
// well as its disk (docs/checkpoints.md, "Memory checkpoints"): while the VM stands for the
// copy of its disk overlay into the checkpoint's layer, its memory and device state are saved
// into a detached tmpfs, and after the thaw they are written into the layer beside its disk
// before it is committed, the state's description last: they count in the checkpoint's size
// and its bound, and a crash before the commit undoes them with the copy. A rollback to such
// a checkpoint marks the sandbox to restore it (the restore mark, restore.json with
// "checkpoint"), and the start restores the layer as a clone's restores its generation: the
// processes run on from the checkpoint. A checkpoint whose memory was not saved (a paused or
// stopped VM, one with volumes) is of its disk alone, and its rollback boots.

// memorySaverFor is rt as a [runtime.MemorySaver] for the sandbox configured as cfg, or nil
// when its checkpoints hold no memory (another runtime, or a microVM with volumes, whose
// virtio-fs devices QEMU cannot save).
func (s *Supervisor) memorySaverFor(rt runtime.Runtime, cfg *store.Config) runtime.MemorySaver {
	ms, ok := rt.(runtime.MemorySaver)
	if !ok || !capturesMemory(rt) || len(cfg.Volumes) > 0 {
		return nil
	}
	return ms
}

// keepCheckpointMemory copies the saved memory in mem (a directory) into dir, the staging
// directory of a checkpoint's layer, each file synced, the state's description ("vm.json",
// which makes the layer one that holds a memory) last, and returns the bytes the copies take
// on the file system (counted in the checkpoint's size and bound).
func keepCheckpointMemory(dir string, mem *os.File) (int64, error) {
	names, err := platform.ReadDirNames(mem)
	if err != nil {
		return 0, err
	}
	const meta = "vm.json"
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == meta && b != meta:
			return 1
		case b == meta && a != meta:
			return -1
		}
		return 0
	})
	d, err := platform.OpenDir(dir)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	var size int64
	for _, name := range names {
		if err := copyStateFile(d, mem, name); err != nil {
			return 0, err
		}
		if err := platform.SyncDir(d); err != nil {
			return 0, err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return 0, err
		}
		size += st.Blocks * 512
	}
	return size, nil
}

// markRollbackRestore, after the rollback of the sandbox l locks to c, marks it to restore
// c's memory at its next start if c's layer holds one, and otherwise removes any restore
// mark of an earlier rollback (its point is left).
func (s *Supervisor) markRollbackRestore(l *store.Lock, rt runtime.Runtime, cp *checkpoint.Sandbox, c *checkpoint.Checkpoint) error {
	ms, ok := rt.(runtime.MemorySaver)
	if !ok || len(c.Chain) == 0 || !ms.HoldsMemory(cp.LayerDir(c.Chain[0])) {
		rr, err := readRestore(l.Dir())
		if err != nil || rr == nil || rr.Checkpoint == nil {
			return err
		}
		return removeRestore(l.Dir())
	}
	return writeRestoreRecord(l.Dir(), &restoreRecord{Format: restoreFormat, Checkpoint: &checkpointRestore{
		Name: c.Name, Layer: c.Chain[0], SavedAt: c.CreatedAt,
	}})
}

// checkpointRestoreFor is the restore of the memory checkpoint rr names, for the sandbox
// configured as cfg, with the guest's clock advanced by the time since the checkpoint; or nil
// when the mark is void, which is removed, and the start boots: the sandbox's chain no
// longer stands on the checkpoint (one rotated since, while stopped), or the sandbox now has
// a network policy and the checkpoint's VM had no NIC, which a restore cannot add (a
// rollback must not leave a sandbox that cannot start).
func (s *Supervisor) checkpointRestoreFor(l *store.Lock, cfg *store.Config, rr *restoreRecord) (*runtime.Restore, error) {
	chain, err := s.chainLowers(l)
	if err != nil {
		return nil, err
	}
	why := ""
	if len(chain) == 0 || filepath.Base(chain[0]) != rr.Checkpoint.Layer {
		why = "the sandbox's disk stands on another point"
	} else if rt, err := s.runtimeFor(cfg); err == nil && s.networked(cfg) {
		if sn, ok := rt.(runtime.SavedNICer); ok {
			if nic, err := sn.SavedNIC(chain[0]); err == nil && !nic {
				why = "the checkpoint's VM had no network interface, and the sandbox now has a network"
			}
		}
	}
	if why != "" {
		s.log.Info("a rollback's memory restore is void; the sandbox boots its checkpoint's disk", "sandbox", l.ID(), "checkpoint", rr.Checkpoint.Name, "why", why)
		return nil, removeRestore(l.Dir())
	}
	return &runtime.Restore{ClockAdvance: max(0, time.Since(rr.Checkpoint.SavedAt))}, nil
}
