//go:build linux

package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// Names in the volumes directory and in each volume's directory.
const (
	Dir        = "volumes" // below the state root
	lockName   = ".lock"
	RecordName = "volume.json"
	ImageName  = "disk.img"
	MountName  = "mnt"
	HoldsName  = "holds"
	// maxRecord bounds what is read of a record.
	maxRecord = 64 << 10
)

// HeldBy reports whether the sandbox id still holds the volume name: it exists (or is being
// provisioned) and its configuration names the volume. A hold it denies is stale.
type HeldBy func(sandboxID, name string) bool

// Store is the volumes of one state root.
type Store struct {
	dir string // <root>/volumes, absolute
	// mu serialises this process's changes; lock (a flock on .lock) serialises them with
	// other processes on the state root (bothyd check --repair beside a running server).
	mu       sync.Mutex
	heldBy   HeldBy
	onChange func(change, name string)
	mke2fs   string
	// files guards each volume's files against its deletion: file operations hold it shared.
	files sync.Map // name -> *sync.RWMutex
	// crashPoint, when set (by tests), is called at each step of a create and a delete, and
	// may kill the process there.
	crashPoint func(step string)
}

func (s *Store) crash(step string) {
	if s.crashPoint != nil {
		s.crashPoint(step)
	}
}

// Open opens (making it if missing) the volumes directory of the state root.
func Open(root string) (*Store, error) {
	abs, err := filepath.Abs(filepath.Join(root, Dir))
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(abs, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, errcode.Storage(fmt.Errorf("volume: make %s: %w", abs, err), root)
	}
	d, err := platform.OpenDir(abs)
	if err != nil {
		return nil, fmt.Errorf("volume: %s must be a directory, not a link: %w", abs, err)
	}
	d.Close()
	return &Store{dir: abs}, nil
}

// SetHeldBy sets how the store learns that a hold is stale; without it every hold is live.
func (s *Store) SetHeldBy(f HeldBy) { s.heldBy = f }

// SetOnChange sets what the store tells of each volume that a Create made (ChangeCreated)
// or a Delete removed (ChangeDeleted), once the change is done and the store's lock is
// released; set it before the store is used. The reconciliation of Recover and Check
// reports nothing: what it removes was never announced as made, or its delete was already
// answered with an error.
func (s *Store) SetOnChange(f func(change, name string)) { s.onChange = f }

func (s *Store) changed(change, name string) {
	if s.onChange != nil {
		s.onChange(change, name)
	}
}

// Dir is the volumes directory.
func (s *Store) Dir() string { return s.dir }

// MountDir is where the volume is mounted on the host.
func (s *Store) MountDir(name string) string { return filepath.Join(s.dir, name, MountName) }

// ImagePath is the volume's image.
func (s *Store) ImagePath(name string) string { return filepath.Join(s.dir, name, ImageName) }

// lock takes the store's lock, in this process and across processes.
func (s *Store) lock() (func(), error) {
	s.mu.Lock()
	f, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("volume: open the lock: %w", err)
	}
	if err := platform.LockWithin(f, true, 30*time.Second, nil); err != nil {
		f.Close()
		s.mu.Unlock()
		return nil, errcode.Wrap(errcode.TransitionInProgress, err, "Another process changes the volumes; retry in a moment.")
	}
	return func() { f.Close(); s.mu.Unlock() }, nil
}

func (s *Store) fileLock(name string) *sync.RWMutex {
	m, _ := s.files.LoadOrStore(name, &sync.RWMutex{})
	return m.(*sync.RWMutex)
}

// readRecord reads the volume's record; (nil, nil) when its directory has none.
func (s *Store) readRecord(name string) (*Volume, error) {
	b, err := platform.ReadFile(filepath.Join(s.dir, name, RecordName), maxRecord)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var v Volume
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("volume: record of %s: %w", name, err)
	}
	if v.Format != RecordFormat || v.Name != name {
		return nil, fmt.Errorf("volume: record of %s has format %d and names %q", name, v.Format, v.Name)
	}
	return &v, nil
}

func (s *Store) writeRecord(v *Volume) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return platform.WriteFileDurable(filepath.Join(s.dir, v.Name), RecordName, append(b, '\n'), 0o600)
}

// Create makes a volume of sizeMB (0: DefaultSizeMB) and mounts it on the host.
func (s *Store) Create(ctx context.Context, name string, sizeMB int) (*Volume, error) {
	v, err := s.create(ctx, name, sizeMB)
	if err == nil {
		s.changed(ChangeCreated, v.Name)
	}
	return v, err
}

func (s *Store) create(ctx context.Context, name string, sizeMB int) (*Volume, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := CheckSize(sizeMB); err != nil {
		return nil, err
	}
	if sizeMB == 0 {
		sizeMB = DefaultSizeMB
	}
	prog, err := s.tool()
	if err != nil {
		return nil, errcode.Wrap(errcode.Unavailable, err, "This server cannot make volumes: %v.", err)
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	names, err := s.names()
	if err != nil {
		return nil, err
	}
	if slices.Contains(names, name) {
		return nil, errcode.New(CodeExists, "A volume named %q exists already; choose another name, or use that one.", name)
	}
	if len(names) >= MaxVolumes {
		return nil, errcode.New(errcode.LimitReached, "The server holds %d volumes, its limit; delete one first.", MaxVolumes)
	}
	dir := filepath.Join(s.dir, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	v := &Volume{Format: RecordFormat, Name: name, SizeMB: sizeMB, CreatedAt: time.Now().UTC(), State: StateCreating}
	// The record first, durably: a crash from here on leaves a volume that start-up and
	// check --repair know to remove.
	if err := s.writeRecord(v); err != nil {
		os.Remove(dir)
		return nil, err
	}
	if err := platform.SyncDirPath(s.dir); err != nil {
		return nil, err
	}
	s.crash("recorded")
	if err := s.make(ctx, v, prog); err != nil {
		if rerr := s.teardown(name); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	s.crash("mounted")
	v.State = StateReady
	if err := s.writeRecord(v); err != nil {
		if rerr := s.teardown(name); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	s.crash("ready")
	return v, nil
}

// make makes the volume's image, its holds directory and mount point, and mounts it.
func (s *Store) make(ctx context.Context, v *Volume, prog string) error {
	dir := filepath.Join(s.dir, v.Name)
	img := filepath.Join(dir, ImageName)
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(int64(v.SizeMB) << 20); err != nil {
		return err
	}
	// -m 0: no blocks reserved for root (the volume is all the user's); root_owner: the
	// volume's root is the sandbox user's, as its home is; lazy inode tables and journal:
	// mke2fs writes some 16 MiB of a 1 TiB image, not gigabytes of zeroes (the kernel zeroes
	// the tables later by discard on the loop device, which keeps the image sparse). The image
	// is handed over open (fd 3), as the file just made, not by a path to look up again.
	//nolint:gosec // prog is mke2fs, found by tool(); every argument is a constant or a descriptor
	cmd := exec.CommandContext(ctx, prog, "-q", "-F", "-t", "ext4", "-m", "0",
		"-E", fmt.Sprintf("root_owner=%d:%d,lazy_itable_init=1,lazy_journal_init=1", userUID, userGID), "/proc/self/fd/3")
	cmd.ExtraFiles = []*os.File{f}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("volume: mke2fs %s: %w: %s", v.Name, err, trunc(string(out)))
	}
	if err := f.Sync(); err != nil {
		return err
	}
	s.crash("image")
	for _, d := range []string{HoldsName, MountName} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if err := platform.SyncDirPath(dir); err != nil {
		return err
	}
	return s.mount(v.Name)
}

// tool finds mke2fs.
func (s *Store) tool() (string, error) {
	if s.mke2fs != "" {
		return s.mke2fs, nil
	}
	if fi, err := os.Stat(platform.LoopControl); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return "", fmt.Errorf("no loop devices (%s is missing)", platform.LoopControl)
	}
	if p, err := exec.LookPath("mke2fs"); err == nil {
		s.mke2fs = p
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mke2fs", "/sbin/mke2fs"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			s.mke2fs = p
			return p, nil
		}
	}
	return "", errors.New("mke2fs (e2fsprogs) is not installed")
}

// mounted reports whether the volume's mount point has a file system of its own mounted.
func (s *Store) mounted(name string) (bool, error) {
	mnt := s.MountDir(name)
	var a, b unix.Stat_t
	if err := unix.Lstat(mnt, &a); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(mnt), &b); err != nil {
		return false, err
	}
	return a.Dev != b.Dev, nil
}

// loopOf returns the loop device (a /dev path) already backed by the volume's image, "" if
// none.
func (s *Store) loopOf(name string) (string, error) {
	img := s.ImagePath(name)
	loops, err := platform.LoopBackingFiles()
	if err != nil {
		return "", err
	}
	devs := make([]string, 0, len(loops))
	for dev, back := range loops {
		if back == img {
			devs = append(devs, dev)
		}
	}
	if len(devs) == 0 {
		return "", nil
	}
	sort.Strings(devs)
	return "/dev/" + devs[0], nil
}

// mount mounts the volume on its mount point unless it is mounted. A loop device already
// backed by its image (a sandbox still holding the file system after the host mount went)
// is mounted again, the same superblock; otherwise a new device, which clears itself once
// the last mount of it goes.
func (s *Store) mount(name string) error {
	if ok, err := s.mounted(name); err != nil || ok {
		return err
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV
	if dev, err := s.loopOf(name); err != nil {
		return err
	} else if dev != "" {
		return platform.Mount(dev, s.MountDir(name), "ext4", flags, "")
	}
	dev, err := platform.AttachLoop(s.ImagePath(name))
	if err != nil {
		return err
	}
	defer dev.Close()
	return platform.Mount(dev.Name(), s.MountDir(name), "ext4", flags, "")
}

// unmount detaches the volume's host mount, if any: file operations in flight keep the file
// system until they end, sandboxes (which a hold keeps it from while any exists) their own.
func (s *Store) unmount(name string) error {
	for {
		ok, err := s.mounted(name)
		if err != nil || !ok {
			return err
		}
		if err := unix.Unmount(s.MountDir(name), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return fmt.Errorf("volume: unmount %s: %w", name, err)
		}
	}
}

// teardown unmounts and removes everything of the volume name: its own mount, and anything
// else mounted at or below its directory.
func (s *Store) teardown(name string) error {
	if err := s.unmount(name); err != nil {
		return err
	}
	for i := 0; ; i++ {
		points, err := platform.MountsUnder(filepath.Join(s.dir, name))
		if err != nil {
			return err
		}
		if len(points) == 0 {
			break
		}
		if i == 8 {
			return fmt.Errorf("volume: %s still has mounts below it: %v", name, points)
		}
		if err := platform.UnmountUnder(filepath.Join(s.dir, name)); err != nil {
			return err
		}
	}
	s.crash("unmounted")
	d, err := platform.OpenDir(s.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := platform.RemoveTreeAt(d, name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return platform.SyncDir(d)
}

// names lists the volumes directory's entries that may be volumes (the store's lock and
// temporary names aside).
func (s *Store) names() ([]string, error) {
	d, err := platform.OpenDir(s.dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	all, err := platform.ReadDirNames(d)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range all {
		if n == lockName {
			continue
		}
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// Get returns the volume name, with its holders and the space in use.
func (s *Store) Get(name string) (*Volume, error) {
	if CheckName(name) != nil {
		return nil, notFound(name)
	}
	v, err := s.readRecord(name)
	if err != nil {
		return nil, err
	}
	if v == nil || v.State == StateDeleting {
		return nil, notFound(name)
	}
	s.fill(v)
	return v, nil
}

// fill adds the holders and the space in use to a record read.
func (s *Store) fill(v *Volume) {
	v.Holders, _ = s.holds(v.Name)
	if ok, _ := s.mounted(v.Name); ok {
		var st unix.Statfs_t
		if unix.Statfs(s.MountDir(v.Name), &st) == nil {
			v.UsedBytes = int64(st.Blocks-st.Bfree) * st.Bsize
		}
	}
}

// List returns every volume that is made or being made, by name.
func (s *Store) List() ([]*Volume, error) {
	names, err := s.names()
	if err != nil {
		return nil, err
	}
	out := []*Volume{}
	for _, n := range names {
		v, err := s.readRecord(n)
		if err != nil || v == nil || v.State == StateDeleting {
			continue
		}
		s.fill(v)
		out = append(out, v)
	}
	return out, nil
}

// holds lists the sandboxes that hold the volume, as recorded.
func (s *Store) holds(name string) ([]string, error) {
	d, err := platform.OpenDir(filepath.Join(s.dir, name, HoldsName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.Close()
	ids, err := platform.ReadDirNames(d)
	if err != nil {
		return nil, err
	}
	out := ids[:0]
	for _, id := range ids {
		if _, tmp := platform.IsTempName(id); !tmp {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out, nil
}

// liveHolds lists the holds that HeldBy confirms, removing the stale ones (under the lock).
func (s *Store) liveHolds(name string) ([]string, error) {
	ids, err := s.holds(name)
	if err != nil {
		return nil, err
	}
	var live []string
	for _, id := range ids {
		if s.heldBy == nil || s.heldBy(id, name) {
			live = append(live, id)
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, name, HoldsName, id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return live, nil
}

// Delete removes the volume name, which no sandbox may hold (423 volume-in-use, naming them).
func (s *Store) Delete(name string) error {
	if err := s.delete(name); err != nil {
		return err
	}
	s.changed(ChangeDeleted, name)
	return nil
}

func (s *Store) delete(name string) error {
	if CheckName(name) != nil {
		return notFound(name)
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	v, err := s.readRecord(name)
	if err != nil {
		return err
	}
	if v == nil {
		return notFound(name)
	}
	live, err := s.liveHolds(name)
	if err != nil {
		return err
	}
	if len(live) > 0 {
		return errcode.New(CodeInUse, "Volume %s is mounted by sandbox(es) %s; delete them (or create them without it) first.", name, joinIDs(live))
	}
	fl := s.fileLock(name)
	fl.Lock()
	defer fl.Unlock()
	if v.State != StateDeleting {
		v.State = StateDeleting
		if err := s.writeRecord(v); err != nil {
			return err
		}
	}
	s.crash("deleting")
	return s.teardown(name)
}

func joinIDs(ids []string) string {
	const max = 20
	s := ""
	for i, id := range ids {
		if i == max {
			return s + " and " + strconv.Itoa(len(ids)-max) + " more"
		}
		if i > 0 {
			s += ", "
		}
		s += id
	}
	return s
}

// Hold records that sandbox id mounts the volumes names (durably, before the sandbox's
// configuration names them). Every volume must be ready.
func (s *Store) Hold(id string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	for _, name := range names {
		v, err := s.readRecord(name)
		if err != nil {
			return err
		}
		if v == nil || v.State != StateReady {
			return notFound(name)
		}
	}
	for _, name := range names {
		if err := platform.WriteFileDurable(filepath.Join(s.dir, name, HoldsName), id, nil, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Release removes sandbox id's holds on the volumes names.
func (s *Store) Release(id string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, name := range names {
		if CheckName(name) != nil {
			continue
		}
		err := os.Remove(filepath.Join(s.dir, name, HoldsName, id))
		if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Source returns the host path that a sandbox mounting the volume name clones: its mount
// point, checked to be mounted.
func (s *Store) Source(name string) (string, error) {
	v, err := s.readRecord(name)
	if err != nil {
		return "", err
	}
	if v == nil || v.State != StateReady {
		return "", notFound(name)
	}
	if ok, err := s.mounted(name); err != nil {
		return "", err
	} else if !ok {
		unlock, err := s.lock()
		if err != nil {
			return "", err
		}
		err = s.mount(name)
		unlock()
		if err != nil {
			return "", err
		}
	}
	return s.MountDir(name), nil
}

// Recover reconciles the volumes at start-up: a half-made volume is removed, an interrupted
// delete finished, a ready volume whose mount is gone (a reboot) mounted again.
func (s *Store) Recover() error {
	_, err := s.check(true)
	return err
}
