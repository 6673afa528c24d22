//go:build linux

package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/record"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/qmp"
	"github.com/bothy/bothy/runtime/microvm/shim"
)

var (
	_ runtime.Pauser            = (*Runtime)(nil)
	_ runtime.LiveLayerer       = (*Runtime)(nil)
	_ runtime.MemoryCapturer    = (*Runtime)(nil)
	_ runtime.ResourcePinner    = (*Runtime)(nil)
	_ runtime.MemoryReleaser    = (*Runtime)(nil)
	_ runtime.SavedNICer        = (*Runtime)(nil)
	_ runtime.MemorySaver       = (*Runtime)(nil)
	_ runtime.SnapshotFlattener = (*Runtime)(nil)
)

// launchInfoName is the running launch's [shim.StateInfo] in the control directory, written
// by Start: which port its guest serves on, which a save records.
const launchInfoName = "vm.json"

// PauseSupport implements runtime.Pauser: every microVM can be stopped by its monitor.
func (r *Runtime) PauseSupport() error { return r.refusal }

// Freeze implements runtime.Pauser: the VM's vCPUs stop (QMP stop, through the shim, which
// notes since when the guest's clock stands), its memory stays.
func (r *Runtime) Freeze(ctx context.Context, sandboxID, dir string) error {
	if _, err := askShim(ctx, dir, "stop"); !errors.Is(err, errNoShim) {
		return err
	}
	q, err := dialQMP(ctx, dir)
	if err != nil {
		return err
	}
	defer q.Close()
	_, err = q.Exec(ctx, "stop", nil, nil)
	return err
}

// Thaw implements runtime.Pauser: the VM runs on (QMP cont, through the shim, which advances
// the guest's clock by the time it stood), or, when its memory is released, is restored and
// runs on from it. A save still streaming (a capture whose bothyd died) is cancelled first.
// A VM without a monitor or a shim does not run: thawed.
func (r *Runtime) Thaw(ctx context.Context, sandboxID, dir string) error {
	if _, err := askShim(ctx, dir, "cont"); !errors.Is(err, errNoShim) {
		return err
	}
	q, err := dialQMP(ctx, dir)
	if errors.Is(err, errNoMonitor) {
		return nil
	}
	if err != nil {
		return err
	}
	defer q.Close()
	st, err := q.Status(ctx)
	if err != nil {
		return err
	}
	switch st {
	case "running", "inmigrate", "prelaunch":
		return nil // running, or a restore's QEMU, which its shim lets run
	case "finish-migrate":
		if _, err := q.Exec(ctx, "migrate_cancel", nil, nil); err != nil {
			return err
		}
	}
	_, err = q.Exec(ctx, "cont", nil, nil)
	return err
}

// Frozen implements runtime.Pauser: the VM is stopped (by a pause or a capture, or after a
// save of its memory that was not followed by its cont), or its memory is released.
func (r *Runtime) Frozen(sandboxID, dir string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), qmp.DefaultTimeout)
	defer cancel()
	if rep, err := askShim(ctx, dir, "state"); err == nil && rep.Released {
		return true, nil
	}
	q, err := dialQMP(ctx, dir)
	if errors.Is(err, errNoMonitor) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer q.Close()
	st, err := q.Status(ctx)
	if err != nil {
		return false, err
	}
	switch st {
	case "paused", "postmigrate", "finish-migrate":
		return true, nil
	}
	return false, nil
}

// ReleaseMemory implements runtime.MemoryReleaser: the shim saves the VM's memory and device
// state into the state directory's memory/ and ends QEMU; the launch (the shim, the control
// socket) lives on, and Thaw restores it.
func (r *Runtime) ReleaseMemory(ctx context.Context, sandboxID, dir string) error {
	if info, err := readLaunchInfo(dir); err == nil && info.Volumes > 0 {
		return ErrVolumesNoMemorySave
	}
	_, err := askShim(ctx, dir, "release")
	return err
}

// errNoShim is a sandbox without a shim's socket: no launch runs.
var errNoShim = errors.New("microvm runtime: no shim listens")

// askShim sends the shim of the sandbox in dir one request on its socket.
func askShim(ctx context.Context, dir, op string) (*shim.ShimReply, error) {
	conn, err := platform.DialUnixNoFollow(ctx, filepath.Join(dir, shim.EntryControl, shim.ShimSocketName))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ECONNREFUSED) {
		return nil, errNoShim
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, uid, _, err := platform.PeerCred(conn); err != nil || uid != os.Geteuid() {
		return nil, fmt.Errorf("microvm runtime: the shim's socket's listener is uid %d (%v), not this user", uid, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	b, _ := json.Marshal(map[string]string{"op": op})
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(io.LimitReader(conn, 1<<16)).ReadSlice('\n')
	if err != nil {
		return nil, fmt.Errorf("microvm runtime: the shim's answer to %s: %w", op, err)
	}
	var rep shim.ShimReply
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, err
	}
	if rep.Error != "" {
		return &rep, fmt.Errorf("microvm runtime: %s: %s", op, rep.Error)
	}
	return &rep, nil
}

// PinsCloneResources implements runtime.ResourcePinner: a memory state restores into a VM of
// the saved one's vCPUs and memory only.
func (r *Runtime) PinsCloneResources() bool { return true }

// CapturesMemory implements runtime.MemoryCapturer.
func (r *Runtime) CapturesMemory() bool { return true }

// OpenLiveLayer implements runtime.LiveLayerer for a stopped ([Runtime.Freeze]) microVM: it
// saves the VM's memory and device state (QMP migrate to a file) and copies its disk overlay,
// flushed and inactivated by the save, and returns the directory of the two with their
// [shim.StateInfo], a snapshot (the VM may continue at once). The disk's copy backs onto
// what the overlay backs onto: [Runtime.FlattenSnapshot] makes it back onto the base disk.
// The directory is the root of a detached tmpfs that only the returned descriptor reaches: closing it frees it, so a crash
// of bothyd leaves nothing of a capture behind in the state directory.
func (r *Runtime) OpenLiveLayer(ctx context.Context, sandboxID, dir string, disk bool) (*os.File, bool, error) {
	info, err := readLaunchInfo(dir)
	if err != nil {
		return nil, false, err
	}
	if info.Volumes > 0 {
		return nil, false, ErrVolumesNoMemorySave
	}
	mnt, err := openScratch()
	if err != nil {
		return nil, false, err
	}
	ok := false
	defer func() {
		if !ok {
			mnt.Close()
		}
	}()
	if err := unix.Fchmod(int(mnt.Fd()), 0o700); err != nil {
		return nil, false, err
	}
	if err := r.saveState(ctx, dir, mnt, info); err != nil {
		return nil, false, err
	}
	overlay, err := platform.OpenFile(filepath.Join(dir, shim.EntryOverlay), os.O_RDONLY, 0)
	if err != nil {
		return nil, false, err
	}
	defer overlay.Close()
	if err := copyInto(mnt, shim.StateDisk, overlay); err != nil {
		return nil, false, fmt.Errorf("microvm runtime: copying the disk overlay: %w", err)
	}
	ok = true
	return mnt, true, nil
}

// SaveMemory implements runtime.MemorySaver for a stopped ([Runtime.Freeze]) microVM: it
// saves the VM's memory and device state and their [shim.StateInfo] into a detached tmpfs,
// as [Runtime.OpenLiveLayer] does but without the disk, which a memory checkpoint copies into
// its own layer while the VM stays stopped.
func (r *Runtime) SaveMemory(ctx context.Context, sandboxID, dir string) (*os.File, error) {
	info, err := readLaunchInfo(dir)
	if err != nil {
		return nil, err
	}
	if info.Volumes > 0 {
		return nil, ErrVolumesNoMemorySave
	}
	mnt, err := openScratch()
	if err != nil {
		return nil, err
	}
	if err := unix.Fchmod(int(mnt.Fd()), 0o700); err != nil {
		mnt.Close()
		return nil, err
	}
	if err := r.saveState(ctx, dir, mnt, info); err != nil {
		mnt.Close()
		return nil, err
	}
	return mnt, nil
}

// HoldsMemory implements runtime.MemorySaver: the layer has the state's description, which
// a memory checkpoint writes last.
func (r *Runtime) HoldsMemory(dir string) bool { return isMemoryGeneration(dir) }

// openScratch mounts a tmpfs, detached, and opens its root, 0700: a directory that only the
// descriptor reaches, freed when it is closed.
func openScratch() (*os.File, error) {
	m, err := platform.MountDetached("tmpfs", "bothyd-capture", unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, err
	}
	defer m.Close() // an O_PATH handle: the root opened below keeps the mount
	fd, err := unix.Openat(int(m.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("microvm runtime: open the capture's scratch directory: %w", err)
	}
	root := os.NewFile(uintptr(fd), "bothyd-capture")
	return root, nil
}

// saveState saves the stopped VM of dir into the directory out: its memory (StateMemory) and
// its StateMeta.
func (r *Runtime) saveState(ctx context.Context, dir string, out *os.File, info *shim.StateInfo) error {
	mem, err := platform.OpenFileAt(out, shim.StateMemory, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer mem.Close()
	q, err := dialQMP(ctx, dir)
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.SaveTo(ctx, mem); err != nil {
		return err
	}
	if err := mem.Sync(); err != nil {
		return err
	}
	b, err := record.Encode(info)
	if err != nil {
		return err
	}
	return platform.WriteFileDurableAt(out, shim.StateMeta, b, 0o600)
}

// copyInto copies src into a new file name in dir.
func copyInto(dir *os.File, name string, src *os.File) error {
	dst, err := platform.OpenFileAt(dir, name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer dst.Close()
	if _, err := io.Copy(dst, src); err != nil {
		return err
	}
	return dst.Sync()
}

// SavedNIC implements runtime.SavedNICer: whether the memory generation in dir was saved
// from a VM with a NIC (its vm.json says so).
func (r *Runtime) SavedNIC(dir string) (bool, error) {
	info, err := readStateInfo(dir, shim.StateMeta)
	if err != nil {
		return false, err
	}
	return info.NIC, nil
}

// readLaunchInfo reads the running launch's StateInfo.
func readLaunchInfo(dir string) (*shim.StateInfo, error) {
	return readStateInfo(filepath.Join(dir, shim.EntryControl), launchInfoName)
}

// readStateInfo reads the StateInfo file name in dir.
func readStateInfo(dir, name string) (*shim.StateInfo, error) {
	b, err := platform.ReadFile(filepath.Join(dir, name), 1<<16)
	if err != nil {
		return nil, err
	}
	var info shim.StateInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("microvm runtime: %s: %w", name, err)
	}
	if info.Format != shim.StateInfoFormat(info.NIC) || (info.Port != 0 && info.Port != 1) {
		return nil, errcode.New(errcode.Internal, "The memory state's %s has format %d and port %d, which this bothyd does not know.", name, info.Format, info.Port)
	}
	return &info, nil
}
