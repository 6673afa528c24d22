package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/store"
)

// Checkpoints of a fork of a running microVM (docs/checkpoints.md, "Checkpoints of a fork: flattened"):
// the fork's disk backs onto its fork-state's disk, which a checkpoint layer's disk would
// name. A layer must stand on its chain and the image alone (what the launch's splitChain,
// the checker's diskBackings and a rollback know), so each layer's disk of a fork is
// flattened onto the image's base disk ([runtime.SnapshotFlattener]), the fork-state's
// clusters copied into it: a running or paused fork's copy in the checkpoint's staging layer,
// before the commit (counted in its size and bound, undone with the copy by a crash); a
// stopped fork's overlay in place before its rotation (a content-preserving rewrite: a crash
// leaves it backing onto the fork-state or onto the base with the same contents). Once the
// fork stands on a chain, the fork-state is no more among its lowers (sandboxLowers).

// checkForkCheckpoint refuses the checkpoint of a fork whose saved state is still to be
// restored (its first start failed): its next start restores that state over a disk made
// anew over the fork-state, which a chain under it would contradict.
func checkForkCheckpoint(l *store.Lock) error {
	rr, err := readRestore(l.Dir())
	if err != nil {
		return err
	}
	if rr != nil && rr.Fork != nil {
		return errcode.New(errcode.CheckpointUnsupported, "Sandbox %s is a fork whose saved state has not been restored yet (its first start did not finish); start it, then checkpoint it.", l.ID())
	}
	return nil
}

// flattenForkLayer makes the disk (named name) in the directory dir, a checkpoint's layer
// of a fork, back onto the image's base disk alone, and returns the bytes that added.
func (s *Supervisor) flattenForkLayer(ctx context.Context, rt runtime.Runtime, id, dir, name string) (int64, error) {
	f, ok := rt.(runtime.SnapshotFlattener)
	if !ok {
		return 0, errcode.New(errcode.CheckpointUnsupported, "Sandbox %s is a fork on the %s runtime, whose disks cannot be made to stand alone; checkpoint the sandbox it was forked from.", id, rt.Kind())
	}
	d, err := platform.OpenDir(dir)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	before, err := diskBlocks(d, name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // a layer without a disk: nothing backs onto the fork-state
	}
	if err != nil {
		return 0, err
	}
	if err := s.flattenSnapshot(ctx, f, d, fmt.Sprintf("The disk of sandbox %s could not be made to stand on its image alone for its checkpoint, which is not taken. Retry the checkpoint.", id)); err != nil {
		return 0, err
	}
	if err := platform.SyncDir(d); err != nil {
		return 0, s.storageErr(err)
	}
	after, err := diskBlocks(d, name)
	if err != nil {
		return 0, err
	}
	s.crash("checkpoint-flattened")
	return after - before, nil
}

// flattenForkOverlay flattens the stopped fork's own disk in place before its rotation into
// a layer.
func (s *Supervisor) flattenForkOverlay(ctx context.Context, rt runtime.Runtime, l *store.Lock, name string) error {
	if fi, err := os.Lstat(filepath.Join(l.Dir(), name)); err != nil || !fi.Mode().IsRegular() {
		return nil // no disk of its own (a rollback threw it away): its chain stands alone
	}
	_, err := s.flattenForkLayer(ctx, rt, l.ID(), l.Dir(), name)
	return err
}

// diskBlocks is the bytes the file name in d takes on the file system.
func diskBlocks(d *os.File, name string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, fs.ErrNotExist
		}
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, errors.New("supervisor: a checkpoint layer's disk is not a regular file")
	}
	return st.Blocks * 512, nil
}

// flattenSnapshot makes the disk of snapshot stand on the image's base disk alone (f): a
// storage fault is reported as the storage's, any other failure as internal, saying failed.
func (s *Supervisor) flattenSnapshot(ctx context.Context, f runtime.SnapshotFlattener, snapshot *os.File, failed string) error {
	if err := f.FlattenSnapshot(ctx, snapshot); err != nil {
		if errcode.StorageFaultOf(err) != errcode.NoStorageFault {
			return s.storageErr(err)
		}
		return errcode.Wrap(errcode.Internal, err, "%s", failed)
	}
	return nil
}
