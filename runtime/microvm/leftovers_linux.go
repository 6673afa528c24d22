//go:build linux

package microvm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/checkpoint"
	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/microvm/shim"
	"github.com/bothy/bothy/store/template"
)

// What a microVM leaves behind, for the consistency checker: its control socket once its shim
// is gone (HostResources), the shared initramfs and base disks of guest stacks that are no
// longer current, and the half-made builds of crashed starts (StaleShared). Its QEMU, should it
// outlive its shim, is among Processes.

// The names of the shared assets in the host base directory.
const (
	assetPrefix     = "microvm-"
	initramfsPrefix = assetPrefix + "initramfs-"
	initramfsSuffix = ".cpio"
	hostBasePrefix  = assetPrefix + "host-"
	stageSuffix     = ".stage"
)

func initramfsName(hash string) string { return initramfsPrefix + hash + initramfsSuffix }

// staleBuildAge is how old a half-made asset must be to be taken for a crashed build's: the
// largest, the host base disk, takes seconds to make, so one this old has no builder left.
const staleBuildAge = 10 * time.Minute

var _ runtime.SharedFiles = (*Runtime)(nil)

// HostResources implements runtime.Runtime: the control socket of each microVM's state
// directory in sandboxesDir that has one, and a launch's released memory. The shim makes it once the guest's agent listens; Cleanup removes
// it once the shim is gone. Outside state directories a microVM holds nothing on the host but
// its processes.
func (r *Runtime) HostResources(sandboxesDir string) ([]runtime.HostResource, error) {
	ents, err := os.ReadDir(sandboxesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []runtime.HostResource
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir := filepath.Join(sandboxesDir, e.Name())
		// A launch's released memory (shim.EntryMemory), which only its shim restores: only a
		// microVM makes the name.
		if _, err := os.Lstat(filepath.Join(dir, shim.EntryMemory)); err == nil {
			out = append(out, runtime.HostResource{Kind: runtime.ResourceFile, SandboxID: e.Name(), Dir: dir,
				Name: filepath.Join(filepath.Base(sandboxesDir), e.Name(), shim.EntryMemory), Paths: []string{filepath.Join(dir, shim.EntryMemory)}})
		}
		sock := r.ControlPath(dir)
		if _, err := os.Lstat(sock); err != nil {
			continue
		}
		// The namespace runtime's socket has the same name; a microVM's directory is told
		// apart by its overlay, which its first start made.
		if _, err := os.Lstat(filepath.Join(dir, shim.EntryOverlay)); err != nil {
			continue
		}
		out = append(out, runtime.HostResource{Kind: runtime.ResourceFile, SandboxID: e.Name(), Dir: dir,
			Name: filepath.Join(filepath.Base(sandboxesDir), e.Name(), shim.EntryControl, shim.SocketName), Paths: []string{sock}})
	}
	return out, nil
}

// StaleShared implements runtime.SharedFiles for the initramfs and base disks in hostBase:
//
//   - a temp name of an asset older than staleBuildAge is a crashed build's;
//   - an initramfs other than the current stack's that no live QEMU names (QEMU reads it at
//     its start only) is an older build's;
//   - a base disk (the host's other than the current one, or an image's) that no qcow2 disk
//     backs onto (a sandbox's overlay, a template generation's frozen disk: see diskBackings)
//     and no live QEMU names is unused, unless it is younger than staleBuildAge (made by a
//     start that is about to make its overlay over it); the next sandbox of its image makes
//     it again. Its removal looks again under the assets lock (lockAssets), which a start
//     holds from its look at the base disk until its overlay is in place.
func (r *Runtime) StaleShared(hostBase, sandboxesDir string, remove bool) ([]runtime.StaleFile, error) {
	st, err := r.stack()
	if err != nil {
		return nil, nil //nolint:nilerr // microVMs cannot run here: no asset of theirs is judged
	}
	ents, err := os.ReadDir(hostBase)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	current := map[string]bool{initramfsName(st.versions.Initramfs): true, hostBaseName(): true}
	var backing *diskSet // read once, if a base disk needs it
	var out []runtime.StaleFile
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(hostBase, name)
		var f runtime.StaleFile
		// A base disk's build stages its tree beside its temp file, as <temp>.stage.
		target, isTemp := platform.IsTempName(strings.TrimSuffix(name, stageSuffix))
		switch {
		case isTemp && strings.HasPrefix(target, assetPrefix):
			fi, err := os.Lstat(path)
			if err != nil || time.Since(fi.ModTime()) < staleBuildAge {
				continue
			}
			f = runtime.StaleFile{Name: name, Why: "a build of " + target + " that did not finish (a crash during a start)"}
		case current[name] || isTemp:
			continue
		case strings.HasPrefix(name, initramfsPrefix) && strings.HasSuffix(name, initramfsSuffix):
			if r.qemuNames(path) {
				continue
			}
			f = runtime.StaleFile{Name: name, Why: "the initramfs of an older guest stack (another bothyd build or kernel); no QEMU uses it"}
		case isBaseDisk(name):
			if backing == nil {
				backing = diskBackings(sandboxesDir)
			}
			if r.baseInUse(path, backing) {
				continue
			}
			f = runtime.StaleFile{Name: name, Why: "a base disk (of an older host, or of an image) that no sandbox's disk, template generation's disk or QEMU uses"}
			if remove {
				removed, err := r.removeBase(hostBase, path, sandboxesDir)
				if err != nil {
					return out, err
				}
				if removed {
					out = append(out, f)
				}
				continue
			}
		default:
			continue
		}
		if remove {
			if err := r.removeStale(path, name); err != nil {
				return out, err
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// isBaseDisk says whether name is a base disk's: the host's or an OCI image's.
func isBaseDisk(name string) bool {
	return strings.HasPrefix(name, hostBasePrefix) || strings.HasPrefix(name, imageBasePrefix)
}

// baseInUse says whether the base disk at path is needed: a disk of backing backs onto it, a
// live QEMU names it, or it is younger than staleBuildAge. The age covers a start that made
// the disk and has yet to make its overlay over it without the assets lock (a bothyd of
// before the lock); a base disk is written once, so its mtime is its making.
func (r *Runtime) baseInUse(path string, backing *diskSet) bool {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || time.Since(fi.ModTime()) < staleBuildAge {
		return true
	}
	return backing.has(path, fi) || r.qemuNames(path)
}

// removeBase removes the unused base disk at path after looking again, under the assets
// lock of hostBase taken exclusively, that no disk backs onto it and no QEMU names it: a start
// holds that lock shared from its look at its base disk until its overlay names it, so none
// is between the two now. It reports false (and removes nothing) if the lock is held, a start
// being under way, or the disk came into use.
func (r *Runtime) removeBase(hostBase, path, sandboxesDir string) (bool, error) {
	l, err := lockAssets(hostBase, false)
	if err != nil || l == nil {
		return false, err
	}
	defer l.Close() // closing releases the lock
	if r.baseInUse(path, diskBackings(sandboxesDir)) {
		return false, nil
	}
	return true, os.Remove(path)
}

// assetsLockName is the assets lock in the host base directory (see lockAssets).
const assetsLockName = assetPrefix + "assets.lock"

// lockAssets takes the assets lock of the host base directory dir: shared (waiting for it)
// by a start, from its look at its base disk until its overlay names it, and exclusive (not
// waiting: nil if it is held) by the removal of an unused base disk. flock dies with its
// holder, so a crashed start never keeps a disk. The caller closes the file to unlock.
func lockAssets(dir string, shared bool) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := platform.OpenFile(filepath.Join(dir, assetsLockName), os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if shared {
		err = platform.LockShared(f)
	} else {
		var taken bool
		if taken, err = platform.TryLock(f); err == nil && !taken {
			f.Close()
			return nil, nil
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("microvm runtime: the assets lock: %w", err)
	}
	return f, nil
}

// removeTemps removes the temp files of name's writes (platform.TempName) in dir, which a
// crash left: the caller knows no write of name is in flight.
func removeTemps(dir, name string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if target, ok := platform.IsTempName(e.Name()); ok && target == name {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// removeStale removes an asset StaleShared judged stale, after looking again that no QEMU
// started with it meanwhile.
func (r *Runtime) removeStale(path, name string) error {
	if _, temp := platform.IsTempName(name); !temp && r.qemuNames(path) {
		return fmt.Errorf("microvm runtime: %s came into use", path)
	}
	return os.RemoveAll(path)
}

// qemuNames says whether a live QEMU of this runtime's executable names path in its command
// line (any QEMU on the host: a state root's assets could be shared).
func (r *Runtime) qemuNames(path string) bool {
	qemu := r.cfg.QEMU
	if resolved, err := filepath.EvalSymlinks(qemu); err == nil {
		qemu = resolved
	}
	pids, err := procPids()
	if err != nil {
		return true // cannot look: in use, for all we know
	}
	for _, pid := range pids {
		if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err != nil || exe != qemu {
			continue
		}
		for _, a := range cmdline(pid) {
			if bytes.Contains(a, []byte(path)) {
				return true
			}
		}
	}
	return false
}

// diskSet is the set of files that qcow2 disks back onto, by the name in their headers (made
// absolute) and by identity, so that a state root reached through another path still
// matches. unsure says that a directory or a disk could not be read: then every file may be
// in use.
type diskSet struct {
	names  map[string]bool
	files  map[[2]uint64]bool
	unsure bool
}

func (d *diskSet) add(disk, backing string) {
	if !filepath.IsAbs(backing) {
		backing = filepath.Join(filepath.Dir(disk), backing) // as QEMU resolves it
	}
	d.names[filepath.Clean(backing)] = true
	var st unix.Stat_t
	if unix.Stat(backing, &st) == nil {
		d.files[[2]uint64{st.Dev, st.Ino}] = true
	}
}

// has says whether path, of file info fi, is in the set.
func (d *diskSet) has(path string, fi fs.FileInfo) bool {
	if d.unsure || d.names[filepath.Clean(path)] {
		return true
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && d.files[[2]uint64{st.Dev, st.Ino}]
}

// diskBackings is the set of files that the microVM disks of the state root of sandboxesDir
// back onto: the overlays of its state directories (<sandboxesDir>/<id>/disk.qcow2) and of
// their checkpoints (<id>/checkpoints/layers/<layer>/disk.qcow2), then the
// frozen disks of its template store's generations and captures in flight
// (templates/<name>/<generation or staging>/payload/disk.qcow2). A clone's overlay backs
// onto its generation's disk, a fork's onto its fork-state's disk (runtime.ForkStateName), which
// backs onto its source's base disk, a clone's generation's disk onto the one before, and the first
// generation's onto a base disk: every base disk in use is the direct backing of one of
// these. Released memory (shim.EntryMemory) holds no disk: its launch's is the overlay.
//
// The sandboxes are read first: a capture holds its sandbox's lifecycle lock until its
// generation is in place, so a sandbox deleted after it was read has left its generation for
// the read of the templates.
//
// A disk that is missing, a link or no qcow2 image is none (a namespace sandbox's state
// directory, a namespace generation's payload, whose files are its sandbox's); one that is
// there and does not read (a capture's copy just begun) makes the set unsure. The payload of
// a namespace generation is written by its sandbox, which can so keep base disks, never have
// one removed.
func diskBackings(sandboxesDir string) *diskSet {
	d := &diskSet{names: map[string]bool{}, files: map[[2]uint64]bool{}}
	read := func(disk string) {
		b, err := qcow2Backing(disk)
		switch {
		case err == nil && b != "":
			d.add(disk, b)
		case err == nil, errors.Is(err, fs.ErrNotExist), errors.Is(err, unix.ELOOP), errors.Is(err, errNotQCOW2):
		default:
			d.unsure = true
		}
	}
	for _, id := range d.dirNames(sandboxesDir) {
		read(filepath.Join(sandboxesDir, id, shim.EntryOverlay))
		// A fork's frozen disk (its copy of its source's overlay) backs onto its source's
		// base disk, and the fork's own overlay onto it.
		read(filepath.Join(sandboxesDir, id, runtime.ForkStateName, shim.StateDisk))
		// A checkpoint's disk backs onto the one below it in the chain, the chain's bottom
		// onto a base disk, which a rollback makes the sandbox's backing again.
		layers := checkpoint.LayersDir(filepath.Join(sandboxesDir, id))
		for _, l := range d.dirNames(layers) {
			read(filepath.Join(layers, l, shim.EntryOverlay))
		}
	}
	templates := filepath.Join(filepath.Dir(sandboxesDir), template.TemplatesDir)
	for _, name := range d.dirNames(templates) {
		for _, gen := range d.dirNames(filepath.Join(templates, name)) {
			read(filepath.Join(templates, name, gen, template.PayloadDir, shim.StateDisk))
		}
	}
	return d
}

// dirNames lists the directories in dir; one that is there and does not read makes d unsure.
func (d *diskSet) dirNames(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			d.unsure = true
		}
		return nil
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

var errNotQCOW2 = errors.New("not a qcow2 image")

// qcow2Backing reads the backing file name from a qcow2 image's header ("" if it has none).
// The header is QEMU's writing, not the guest's (the guest writes the virtual disk only), but
// it is read without following a link and with every length bounded all the same.
func qcow2Backing(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var hdr [20]byte
	if _, err := io.ReadFull(f, hdr[:]); err != nil {
		return "", err
	}
	if !bytes.Equal(hdr[:4], []byte("QFI\xfb")) {
		return "", fmt.Errorf("%s: %w", path, errNotQCOW2)
	}
	off, size := binary.BigEndian.Uint64(hdr[8:16]), binary.BigEndian.Uint32(hdr[16:20])
	if off == 0 || size == 0 {
		return "", nil
	}
	if size > 1023 || off > 1<<20 {
		return "", fmt.Errorf("%s: a backing file name of %d bytes at %d", path, size, off)
	}
	name := make([]byte, size)
	if _, err := f.ReadAt(name, int64(off)); err != nil {
		return "", err
	}
	return string(name), nil
}
