//go:build linux

package microvm

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime/microvm/guest"
)

// cpioFile is one entry of the initramfs.
type cpioFile struct {
	name string // without the leading slash
	mode uint32 // type and permission bits
	src  string // the host file of a regular file's content
}

// initramfsFiles lists the initramfs: the runtime binary as /init, its ELF interpreter and
// libraries when it is linked dynamically (a build with cgo), and the kernel's virtio modules
// with their load order.
func initramfsFiles(exe, modulesDir string) ([]cpioFile, []byte, error) {
	files := []cpioFile{
		{name: "dev", mode: 0o040755}, {name: "proc", mode: 0o040755}, {name: "sys", mode: 0o040755},
		{name: strings.TrimPrefix(guest.ModulesDir, "/"), mode: 0o040755},
		{name: "init", mode: 0o100755, src: exe},
	}
	libs, err := elfDeps(exe)
	if err != nil {
		return nil, nil, err
	}
	dirs := map[string]bool{}
	for _, l := range libs {
		for d := filepath.Dir(l.name); d != "."; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range slices.Sorted(func(yield func(string) bool) {
		for d := range dirs {
			if !yield(d) {
				return
			}
		}
	}) {
		files = append(files, cpioFile{name: d, mode: 0o040755})
	}
	files = append(files, libs...)
	for _, m := range guest.Modules {
		src, err := findModule(modulesDir, m)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, cpioFile{name: strings.TrimPrefix(guest.ModulesDir, "/") + "/" + m + ".ko", mode: 0o100644, src: src})
	}
	order := []byte(strings.Join(guest.Modules, "\n") + "\n")
	return files, order, nil
}

// findModule finds the module name (uncompressed; the guest's finit_module gets it as is)
// below modulesDir, the kernel's /lib/modules/<release>.
func findModule(modulesDir, name string) (string, error) {
	var found string
	err := filepath.WalkDir(filepath.Join(modulesDir, "kernel"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (d.Name() == name+".ko" || d.Name() == strings.ReplaceAll(name, "_", "-")+".ko") {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if found == "" {
		return "", fmt.Errorf("microvm runtime: the kernel module %s is not in %s (a compressed module is not supported)", name, modulesDir)
	}
	return found, nil
}

// libDirs are where the ELF dependencies of a dynamically linked runtime binary are looked up.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// elfDeps returns the interpreter and the libraries (transitively) that exe needs, as
// initramfs entries: the interpreter at its own path, the libraries in lib/x86_64-linux-gnu
// (a directory of the loader's default search path). A static binary needs none.
func elfDeps(exe string) ([]cpioFile, error) {
	f, err := elf.Open(exe)
	if err != nil {
		return nil, fmt.Errorf("microvm runtime: the runtime binary: %w", err)
	}
	defer f.Close()
	var out []cpioFile
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return nil, err
			}
			interp := string(bytes.TrimRight(b, "\x00"))
			out = append(out, cpioFile{name: strings.TrimPrefix(interp, "/"), mode: 0o100755, src: interp})
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	seen := map[string]bool{}
	queue, err := f.ImportedLibraries()
	if err != nil {
		return nil, err
	}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		path, err := findLib(name)
		if err != nil {
			return nil, err
		}
		out = append(out, cpioFile{name: "lib/x86_64-linux-gnu/" + name, mode: 0o100755, src: path})
		lf, err := elf.Open(path)
		if err != nil {
			return nil, err
		}
		more, _ := lf.ImportedLibraries()
		lf.Close()
		queue = append(queue, more...)
	}
	return out, nil
}

func findLib(name string) (string, error) {
	for _, d := range libDirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("microvm runtime: the library %s of the runtime binary is not found", name)
}

// writeCPIO writes files as a cpio archive (newc) to w, deterministically (inode numbers in
// order, times zero), so that its hash names its content.
func writeCPIO(w io.Writer, files []cpioFile, order []byte) error {
	ino := 1
	entry := func(name string, mode uint32, size int, body io.Reader) error {
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0)
		ino++
		if _, err := io.WriteString(w, hdr+name+"\x00"+pad(len(hdr)+len(name)+1)); err != nil {
			return err
		}
		if body != nil {
			n, err := io.Copy(w, body)
			if err != nil {
				return err
			}
			if n != int64(size) {
				return fmt.Errorf("microvm runtime: %s changed while it was archived", name)
			}
		}
		_, err := io.WriteString(w, pad(size))
		return err
	}
	for _, f := range files {
		if f.src == "" {
			if err := entry(f.name, f.mode, 0, nil); err != nil {
				return err
			}
			continue
		}
		src, err := os.Open(f.src)
		if err != nil {
			return err
		}
		fi, err := src.Stat()
		if err == nil {
			err = entry(f.name, f.mode, int(fi.Size()), src)
		}
		src.Close()
		if err != nil {
			return err
		}
	}
	if err := entry(strings.TrimPrefix(guest.ModulesOrder, "/"), 0o100644, len(order), bytes.NewReader(order)); err != nil {
		return err
	}
	return entry("TRAILER!!!", 0, 0, nil)
}

func pad(n int) string { return strings.Repeat("\x00", (4-n%4)%4) }

// initramfsHash hashes the initramfs that files make.
func initramfsHash(files []cpioFile, order []byte) (string, error) {
	h := sha256.New()
	if err := writeCPIO(h, files, order); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// ensureFile makes parent/name with write unless it is there: under a temporary name, synced
// and renamed into place, so that no start sees a partial file and concurrent makers agree.
func ensureFile(parent, name string, write func(tmp string) error) (string, error) {
	path := filepath.Join(parent, name)
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
		return path, nil
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", err
	}
	tmp := filepath.Join(parent, platform.TempName(name))
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := write(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	d, err := platform.OpenDir(parent)
	if err != nil {
		return "", err
	}
	defer d.Close()
	return path, platform.SyncDir(d)
}

// writeInitramfs writes the initramfs to path.
func writeInitramfs(path string, files []cpioFile, order []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := writeCPIO(f, files, order); err != nil {
		return err
	}
	return f.Sync()
}

// memInitramfs writes the initramfs into a memory file (memfd) and returns it, rewound.
func memInitramfs(files []cpioFile, order []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("bothyd-initramfs", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd for the initramfs: %w", err)
	}
	f := os.NewFile(uintptr(fd), "initramfs")
	if err := writeCPIO(f, files, order); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// hostCore are the host's directories that the host image's base disk holds: the programs
// and the shared libraries they link. The rest of /usr (toolchains, browsers, SDKs) stays out:
// the whole of /usr is many GiB, copied into every state root's base disk.
var hostCore = []string{"usr/bin", "usr/sbin", "usr/libexec", "usr/lib/x86_64-linux-gnu", "usr/lib64"}

// hostBaseFormat names the base disk's layout; a change of it makes a new disk.
const hostBaseFormat = "microvm-host-base 2"

// hostBaseName names the host image's base disk by its format and what it is made of: the
// host's os-release and ld.so.cache stand for the host's installed packages.
func hostBaseName() string {
	h := sha256.New()
	fmt.Fprintln(h, hostBaseFormat, hostCore)
	for _, f := range []string{"/etc/os-release", "/etc/ld.so.cache"} {
		b, _ := os.ReadFile(f)
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return "microvm-host-" + hex.EncodeToString(h.Sum(nil))[:16] + ".ext4"
}

// writeHostBase makes the host image's base disk at path: an ext4 file system (mke2fs -d)
// of a tree staged beside it: the directory skeleton, a generated /etc, and hostCore linked
// (or, on another file system, copied) from the host. It is as small as its content allows:
// the room for the sandbox's own files is its overlay's, which the guest's init grows the
// file system into at boot.
func writeHostBase(path, mkfs string) error {
	stage := path + stageSuffix
	_ = os.RemoveAll(stage)
	defer os.RemoveAll(stage)
	if err := stageHostTree(stage); err != nil {
		return err
	}
	return mkfsTree(mkfs, stage, path)
}

func stageHostTree(stage string) error {
	for _, d := range []struct {
		name string
		perm os.FileMode
	}{{"", 0o755}, {"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"run", 0o755}, {"tmp", 0o1777},
		{"root", 0o700}, {"home", 0o755}, {"home/user", 0o755}, {"etc", 0o755}, {"var", 0o755},
		{"var/tmp", 0o1777}, {"usr", 0o755}, {"usr/lib", 0o755}, {"mnt", 0o755}, {"opt", 0o755}} {
		p := filepath.Join(stage, d.name)
		if err := os.Mkdir(p, d.perm); err != nil {
			return err
		}
		if err := os.Chmod(p, d.perm); err != nil {
			return err
		}
	}
	if err := os.Chown(filepath.Join(stage, "home/user"), 1000, 1000); err != nil {
		return err
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(stage, l)); err != nil {
			return err
		}
	}
	for _, d := range hostCore {
		src := "/" + d
		if _, err := os.Stat(src); err != nil {
			continue
		}
		dst := filepath.Join(stage, filepath.Dir(d))
		// Hard links cost no copy where the state root shares the host's file system.
		if err := exec.Command("cp", "-a", "--link", src, dst).Run(); err != nil { //nolint:noctx // a one-off build
			_ = os.RemoveAll(filepath.Join(stage, d))
			if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil { //nolint:noctx // a one-off build
				return fmt.Errorf("microvm runtime: copy %s: %v: %s", src, err, out)
			}
		}
	}
	return writeEtc(filepath.Join(stage, "etc"))
}

// writeEtc writes the base disk's /etc: users, groups, name service and resolver
// configuration, and public host files that programs expect.
func writeEtc(etc string) error {
	shell := "/bin/sh"
	if _, err := os.Stat("/usr/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	files := map[string]string{
		"passwd": "root:x:0:0:root:/root:" + shell + "\nuser:x:1000:1000:user:/home/user:" + shell +
			"\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group":         "root:x:0:\ntty:x:5:\nusers:x:100:\nuser:x:1000:\nnogroup:x:65534:\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
		"resolv.conf":   "nameserver 127.0.0.1\n",
		"hostname":      "localhost\n",
		"hosts":         "127.0.0.1\tlocalhost\n",
	}
	for _, name := range []string{"os-release", "ld.so.cache", "ld.so.conf", "protocols", "services"} {
		if b, err := os.ReadFile(filepath.Join("/etc", name)); err == nil {
			files[name] = string(b)
		}
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	if fi, err := os.Lstat("/etc/alternatives"); err == nil && fi.IsDir() {
		if out, err := exec.Command("cp", "-a", "/etc/alternatives", etc).CombinedOutput(); err != nil { //nolint:noctx // a one-off build
			return fmt.Errorf("microvm runtime: copy /etc/alternatives: %v: %s", err, out)
		}
	}
	return nil
}

// errNoKernel says the guest kernel is missing.
var errNoKernel = errors.New("no Debian cloud kernel (/boot/vmlinuz-*-cloud-amd64; scripts/setup installs linux-image-cloud-amd64)")
