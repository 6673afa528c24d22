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
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/platform"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/microvm/shim"
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
//   - a base disk (the host's other than the current one, or an image's) that no sandbox's
//     overlay backs onto is a note only: a template generation's frozen disk may back onto
//     it, and the next sandbox of the image would use it again.
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
	var backing map[string]bool // read once, if a base disk needs it
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
			f = runtime.StaleFile{Name: name, Why: "the initramfs of an older guest stack (another sandboxd build or kernel); no QEMU uses it"}
		case strings.HasPrefix(name, hostBasePrefix) || strings.HasPrefix(name, imageBasePrefix):
			if backing == nil {
				backing = overlayBackings(sandboxesDir)
			}
			if backing[path] {
				continue
			}
			out = append(out, runtime.StaleFile{Name: name, Note: true,
				Why: "a base disk (of an older host, or of an image) that no sandbox's disk backs onto; a template generation's may"})
			continue
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

// overlayBackings is the set of backing files that the overlays of the state directories in
// sandboxesDir name.
func overlayBackings(sandboxesDir string) map[string]bool {
	out := map[string]bool{}
	ents, err := os.ReadDir(sandboxesDir)
	if err != nil {
		return out
	}
	for _, e := range ents {
		if b, err := qcow2Backing(filepath.Join(sandboxesDir, e.Name(), shim.EntryOverlay)); err == nil && b != "" {
			out[filepath.Clean(b)] = true
		}
	}
	return out
}

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
		return "", fmt.Errorf("%s: not a qcow2 image", path)
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
