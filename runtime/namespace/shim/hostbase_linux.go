//go:build linux

package shim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
)

// hostBaseFormat names the layout hostBase.write produces; a change of it makes a new layer.
const hostBaseFormat = "host-base 3"

// hostBase is the lowest layer of the host image: the directory skeleton, the merged-usr
// links, and a generated /etc, made from what the host has. It holds nothing of any sandbox
// (each one's /etc/hostname and /etc/hosts are a layer of their own, see hostFilesLayer) and
// nothing secret, so one copy serves every sandbox of a state root: it is built once, in a
// directory named by a hash of its content, and shared read-only as an overlay lower layer.
// (Built per sandbox, it cost some 40 inodes made and removed per sandbox, and on a busy
// ext4 the allocation of inodes next to recently deleted ones took a third of the CPU of a
// create-start-stop-delete cycle.)
type hostBase struct {
	links        map[string]string // merged-usr name → link target, or "" for a directory
	files        map[string][]byte // /etc file name → content
	localtime    string            // the target of /etc/localtime, if it points into /usr
	alternatives bool              // the host has /etc/alternatives
}

// readHostBase reads what the layer is made from.
func readHostBase() (*hostBase, error) {
	h := &hostBase{links: map[string]string{}, files: map[string][]byte{}}
	for _, name := range mergedUsrLinks {
		fi, err := os.Lstat("/" + name)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink("/" + name)
			if err != nil {
				return nil, err
			}
			h.links[name] = target
		case fi.IsDir():
			h.links[name] = ""
		}
	}
	shell := "/bin/sh"
	if _, err := os.Stat("/usr/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	h.files["passwd"] = []byte("root:x:0:0:root:/root:" + shell + "\n" +
		fmt.Sprintf("user:x:%d:%d:user:%s:%s\n", userUID, userGID, userHome, shell) +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
	h.files["group"] = []byte("root:x:0:\ntty:x:5:\nusers:x:100:\n" + fmt.Sprintf("user:x:%d:\n", userGID) + "nogroup:x:65534:\n")
	h.files["nsswitch.conf"] = []byte("passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n")
	// The sandbox has no network but loopback; a resolver that points nowhere fails fast.
	h.files["resolv.conf"] = []byte("nameserver 127.0.0.1\n")
	// Public host files that programs expect, copied by content.
	for _, name := range []string{"os-release", "ld.so.cache", "ld.so.conf", "protocols", "services", "issue"} {
		if b, err := os.ReadFile(filepath.Join("/etc", name)); err == nil {
			h.files[name] = b
		}
	}
	if target, err := os.Readlink("/etc/localtime"); err == nil && strings.HasPrefix(target, "/usr/") {
		h.localtime = target
	}
	if fi, err := os.Lstat("/etc/alternatives"); err == nil && fi.IsDir() {
		h.alternatives = true
	}
	return h, nil
}

// name is the layer's directory name: the format and a hash of the content, so that a host
// whose files changed (an upgrade's ld.so.cache) gets a new layer rather than a stale one.
func (h *hostBase) name() string {
	sum := sha256.New()
	fmt.Fprintf(sum, "%s\n%s\n%v\n", hostBaseFormat, h.localtime, h.alternatives)
	for _, k := range slices.Sorted(maps.Keys(h.links)) {
		fmt.Fprintf(sum, "link %q %q\n", k, h.links[k])
	}
	for _, k := range slices.Sorted(maps.Keys(h.files)) {
		fmt.Fprintf(sum, "file %q %d\n", k, len(h.files[k]))
		sum.Write(h.files[k])
	}
	return "host-" + hex.EncodeToString(sum.Sum(nil))[:16]
}

// ensure makes the layer in parent/h.name() unless it is there, and returns its path. It is
// written under a temporary name, synced, and renamed into place, so that concurrent starts
// and crashes never expose a partial layer; whoever renames first wins, the others use it.
func (h *hostBase) ensure(parent string) (string, error) {
	dir := filepath.Join(parent, h.name())
	if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
		return dir, nil
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", err
	}
	removeStaleTemps(parent)
	tmp := filepath.Join(parent, platform.TempName(filepath.Base(dir)))
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := h.write(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if fi, lerr := os.Lstat(dir); lerr == nil && fi.IsDir() {
			return dir, nil // another start made it first
		}
		return "", err
	}
	pd, err := platform.OpenDir(parent)
	if err != nil {
		return "", err
	}
	defer pd.Close()
	return dir, platform.SyncDir(pd)
}

// staleTempAge is how old a half-built layer must be to be taken for a crashed build's: a
// build takes milliseconds, so one this old has no builder left.
const staleTempAge = 10 * time.Minute

// removeStaleTemps removes what builds that crashed left in parent.
func removeStaleTemps(parent string) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		if _, ok := platform.IsTempName(e.Name()); !ok {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTempAge {
			_ = os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
}

// write builds the layer in the new directory base.
func (h *hostBase) write(base string) error {
	dirs := []struct {
		name string
		perm os.FileMode
	}{
		{"", 0o755},
		{"usr", 0o755}, {"proc", 0o555}, {"dev", 0o755}, {"etc", 0o755}, {"run", 0o755},
		{"run/bothyd", 0o700}, {"tmp", os.ModeSticky | 0o777}, {"var", 0o755}, {"var/tmp", os.ModeSticky | 0o777},
		{"home", 0o755}, {"home/user", 0o755}, {"root", 0o700}, {"opt", 0o755}, {"mnt", 0o755},
		{"srv", 0o755},
	}
	for _, d := range dirs {
		// Chmod too: the modes are exact whatever the umask (once per host content).
		p := filepath.Join(base, d.name)
		if err := os.Mkdir(p, d.perm); err != nil {
			return err
		}
		if err := os.Chmod(p, d.perm); err != nil {
			return err
		}
	}
	if err := os.Chown(filepath.Join(base, "home/user"), userUID, userGID); err != nil {
		return err
	}
	for name, target := range h.links {
		var err error
		if target == "" {
			err = os.Mkdir(filepath.Join(base, name), 0o755)
		} else {
			err = os.Symlink(target, filepath.Join(base, name))
		}
		if err != nil {
			return err
		}
	}
	etc := filepath.Join(base, "etc")
	for name, content := range h.files {
		if err := platform.WriteFileDurable(etc, name, content, 0o644); err != nil {
			return err
		}
	}
	if h.localtime != "" {
		if err := os.Symlink(h.localtime, filepath.Join(etc, "localtime")); err != nil {
			return err
		}
	}
	// Debian's alternatives (awk, editor, ...) are links through /etc/alternatives into /usr;
	// the host's directory of links is bound read-only over this mount point.
	if h.alternatives {
		if err := os.Mkdir(filepath.Join(etc, "alternatives"), 0o755); err != nil {
			return err
		}
	}
	// The files are durable, each synced with etc; the links and directories made since are
	// entries of etc and base, synced last.
	for _, d := range []string{etc, base} {
		f, err := platform.OpenDir(d)
		if err != nil {
			return err
		}
		err = platform.SyncDir(f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// hostBaseFor finds (and makes, if need be) the host base layer for spec, under
// spec.HostBase (or the sandbox's own directory); it returns the layer's directory.
func hostBaseFor(spec *runtime.Spec) (string, error) {
	hb, err := readHostBase()
	if err != nil {
		return "", fmt.Errorf("read the host image: %w", err)
	}
	parent := spec.HostBase
	if parent == "" {
		parent = filepath.Join(spec.Dir, EntryBase)
	}
	return hb.ensure(parent)
}

// hostFilesLayer makes the sandbox's own /etc/hostname and /etc/hosts, the layer right above
// the shared base (a template generation's files, whiteouts included, and the sandbox's own
// changes come above it, as when these files were part of a base layer of each sandbox), on
// a small tmpfs of its own, detached: nothing of it is on a disk. Remade at every start from
// the host name, it needs no sync and leaves nothing behind a crash. (It was a directory of
// the state directory, hostfiles/, whose four inodes made and removed with every sandbox fed
// ext4's scan past recently deleted inodes: see docs/design-notes.md.)
//
// owner, unless -1, is the host id that owns every file of it (the root directory by tmpfs's
// uid= and gid= options, which the kernel applies as it makes the file system, the rest by
// fchown as each is made): the sandbox root's, where the kernel cannot idmap a tmpfs.
func hostFilesLayer(hostname string, owner int) (*os.File, error) {
	options := "size=64k,nr_inodes=16,mode=0755"
	if owner >= 0 {
		options += fmt.Sprintf(",uid=%d,gid=%d", owner, owner)
	}
	m, err := platform.NewMount("tmpfs", "hostfiles", options,
		unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return nil, fmt.Errorf("the host files' layer: %w", err)
	}
	if err := writeHostFiles(m, hostname, owner); err != nil {
		m.Close()
		return nil, fmt.Errorf("the host files' layer: %w", err)
	}
	return m, nil
}

// writeHostFiles writes etc/hostname and etc/hosts into the fresh file system whose root is
// m, owned by owner unless it is -1.
func writeHostFiles(m *os.File, hostname string, owner int) error {
	if err := platform.MkdirAt(m, "etc", 0o755); err != nil {
		return err
	}
	etc, err := platform.OpenDirAt(m, "etc")
	if err != nil {
		return err
	}
	defer etc.Close()
	if owner >= 0 {
		if err := etc.Chown(owner, owner); err != nil {
			return err
		}
	}
	for _, f := range []struct{ name, content string }{
		{"hostname", hostname + "\n"},
		{"hosts", runtime.EtcHosts(hostname)},
	} {
		w, err := platform.OpenFileAt(etc, f.name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if owner >= 0 {
			err = w.Chown(owner, owner)
		}
		if err == nil {
			_, err = w.WriteString(f.content)
		}
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
