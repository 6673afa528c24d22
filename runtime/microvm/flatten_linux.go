//go:build linux

package microvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bothy/bothy/runtime/microvm/shim"
)

// A fork's saved disk (the copy of the source's overlay in a snapshot) must back onto the
// image's base disk alone, as a fork-state's disk is known to (the checker keeps the base disks
// that fork-states back onto, and a fork holds nothing else of its source): a source on a
// checkpoint chain, or a fork itself, has an overlay that backs onto its layers or its own
// fork-state, which the fork would name without holding. flattenOntoBase rebases the copy
// onto the base disk (qemu-img rebase in its safe mode, which writes into the copy every
// cluster its old backing chain holds and the base does not): the fork then holds its own
// copy of what the source's chain wrote, shared by hard links among the forks of one call.

// FlattenSnapshot implements runtime.SnapshotFlattener: the disk of a snapshot
// ([Runtime.OpenLiveLayer]) is made to back onto the base disk alone. The layers it backs
// onto are frozen files and the copy is the snapshot's, so the VM need not stand for it.
func (r *Runtime) FlattenSnapshot(ctx context.Context, snapshot *os.File) error {
	_, err := flattenOntoBase(ctx, snapshot, shim.StateDisk)
	return err
}

// maxBackingDepth bounds the walk down a disk's backing chain: a checkpoint chain is at most
// checkpoint.MaxChain layers, over at most a fork-state's disk and the base.
const maxBackingDepth = 64

// backingBase walks the backing chain of the qcow2 disk at path down to the disk that backs
// onto nothing (the image's raw base disk) and returns it and the disk path names directly.
func backingBase(path string) (base, direct string, err error) {
	direct, err = qcow2Backing(path)
	if err != nil || direct == "" {
		return "", direct, err
	}
	cur := direct
	for range maxBackingDepth {
		next, err := qcow2Backing(cur)
		if errors.Is(err, errNotQCOW2) {
			return cur, direct, nil // the raw base disk
		}
		if err != nil {
			return "", "", err
		}
		if next == "" {
			return cur, direct, nil
		}
		cur = next
	}
	return "", "", fmt.Errorf("microvm runtime: the backing chain of %s is deeper than %d disks", path, maxBackingDepth)
}

// flattenOntoBase makes the disk name in the directory dir (a snapshot's copy of an overlay)
// back onto its chain's base disk alone, with the clusters of the disks between copied into
// it. A disk that backs onto the base already is left as it is; it reports whether it
// rebased.
func flattenOntoBase(ctx context.Context, dir *os.File, name string) (bool, error) {
	// The directory may be a detached tmpfs, reached by its descriptor alone: qemu-img is
	// given it as its fd 3 and names the disk through /proc/self/fd/3.
	path := filepath.Join("/proc/self/fd", fmt.Sprint(dir.Fd()), name)
	base, direct, err := backingBase(path)
	if err != nil || direct == "" || direct == base {
		return false, err
	}
	format := "raw"
	if _, err := qcow2Backing(base); err == nil {
		format = "qcow2"
	}
	img, err := qemuImg()
	if err != nil {
		return false, err
	}
	cmd := exec.CommandContext(ctx, img, "rebase", "-q", "-f", "qcow2", "-F", format, "-b", base, filepath.Join("/proc/self/fd/3", name))
	cmd.ExtraFiles = []*os.File{dir}
	if out, err := cmd.CombinedOutput(); err != nil {
		return false, fmt.Errorf("microvm runtime: qemu-img rebase of a fork's disk onto its base disk: %v: %s", err, bytes.TrimSpace(out))
	}
	return true, syncFile(filepath.Join("/proc/self/fd", fmt.Sprint(dir.Fd()), name))
}
