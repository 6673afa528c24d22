//go:build linux

package microvm

import (
	"bytes"
	"crypto/sha256"
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

	"github.com/bothy/bothy/runtime"
)

// An OCI image's base disk: the image's layers (overlay lower directories, unpacked by the
// image store: whiteouts as character devices 0/0, opaque directories by the xattr
// trusted.overlay.opaque=y) merged bottom to top into a staged tree, and the tree made an ext4
// file system by mke2fs -d. It is shared by every microVM of the image, named by a hash of
// its layers (directories named by their diff ids, so content-addressed) and of the files
// bothyd adds to the image (the image files layer, in the sandbox's state directory),
// without the two that differ per sandbox and that the guest's init writes at every boot
// anyway (/etc/hostname, /etc/hosts).
//
// The layers are written by whoever made the image: the merge never follows a link. Every
// entry is made with *at calls relative to a descriptor of its parent in the stage, and
// every directory is opened with O_NOFOLLOW, so that a symbolic link of a lower layer where
// an upper layer has a directory is replaced by that directory (as overlayfs shows it), never
// written through. Files are hard-linked from the layers into the stage (mke2fs reads them;
// nothing writes them) or, across file systems, copied.

// imageBaseFormat versions the merge and the disk's layout: a change names every disk anew.
const imageBaseFormat = "microvm-image/1"

const imageBasePrefix = assetPrefix + "image-"

// perSandboxFiles are the image files layer's entries that differ per sandbox; the guest's
// init writes them at every boot, so the shared disk leaves them out.
var perSandboxFiles = []string{"etc/hostname", "etc/hosts"}

// imageLayers splits the spec's layers, bottom first, into the image's own (shared) and the
// ones in the sandbox's state directory (the image files layer).
func imageLayers(spec runtime.Spec) []string {
	layers := []string{spec.ImageDir}
	for i := len(spec.Lowers) - 1; i >= 0; i-- {
		layers = append(layers, spec.Lowers[i])
	}
	return layers
}

// inSandbox says whether layer lies in the sandbox's state directory dir.
func inSandbox(layer, dir string) bool {
	return strings.HasPrefix(filepath.Clean(layer), filepath.Clean(dir)+"/")
}

// imageBaseName names the base disk of the layers (bottom first) of a sandbox in dir.
func imageBaseName(layers []string, dir string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, imageBaseFormat)
	for _, l := range layers {
		if !inSandbox(l, dir) {
			fmt.Fprintf(h, "layer %q\n", filepath.Clean(l))
			continue
		}
		fmt.Fprintln(h, "own layer")
		if err := hashTree(h, l); err != nil {
			return "", fmt.Errorf("microvm runtime: the image files layer: %w", err)
		}
	}
	return imageBasePrefix + hex.EncodeToString(h.Sum(nil))[:16] + ".ext4", nil
}

// maxOwnLayer bounds what is hashed of a layer in the sandbox's state directory: bothyd
// writes it (a few small files of /etc and some directories).
const maxOwnLayer = 16 << 20

// hashTree writes every entry of the tree at root (without following links) to h: its path,
// type, mode, owner, and a regular file's content or a link's target. perSandboxFiles are
// left out.
func hashTree(h io.Writer, root string) error {
	var total int64
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if slices.Contains(perSandboxFiles, rel) {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %o %d %d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			total += st.Size
			if total > maxOwnLayer {
				return fmt.Errorf("%s holds more than %d bytes", root, maxOwnLayer)
			}
			b, err := readNoFollow(p, maxOwnLayer)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			fmt.Fprintf(h, " %x", sum)
		case unix.S_IFLNK:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %q", t)
		}
		fmt.Fprintln(h)
		return nil
	})
}

func readNoFollow(p string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// writeImageBase makes the base disk of layers (bottom first) at path: their merge staged
// beside it, then mke2fs -d. The file system is as small as the content allows; the guest's
// init grows it to its disk (the sandbox's overlay, sized for its room) at boot.
func writeImageBase(path, mkfs string, layers []string, dir string) error {
	stage := path + stageSuffix
	if err := os.RemoveAll(stage); err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	if err := os.Mkdir(stage, 0o755); err != nil {
		return err
	}
	root, err := openDir(unix.AT_FDCWD, stage)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, l := range layers {
		src, err := openDir(unix.AT_FDCWD, l)
		if err != nil {
			return fmt.Errorf("microvm runtime: open the image layer %s: %w", l, err)
		}
		var skip []string
		if inSandbox(l, dir) {
			skip = perSandboxFiles
		}
		err = mergeDir(src, root, "", skip)
		src.Close()
		if err != nil {
			return fmt.Errorf("microvm runtime: merge the image layer %s: %w", l, err)
		}
	}
	// The mount points the guest's init moves its file systems onto, where the image lacks
	// them (a link there, /run to /var/run say, is the image's and stays).
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp"} {
		if err := unix.Mkdirat(int(root.Fd()), d, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
	}
	return mkfsTree(mkfs, stage, path)
}

// mkfsTree makes an ext4 file system of the tree stage at path, sized for its content.
func mkfsTree(mkfs, stage, path string) error {
	var size, entries int64
	_ = filepath.WalkDir(stage, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return nil //nolint:nilerr // a size estimate: what cannot be read is not counted
		}
		entries++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	// Content, an eighth for the file system's own blocks, a block per entry, and some room
	// for the journal: the room for the sandbox's files is its overlay's, grown into at boot.
	sizeMB := (size+size/8+entries*4096)>>20 + 64
	inodes := entries + entries/2 + 4096
	out, err := exec.Command(mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-d", stage, "-N", fmt.Sprint(inodes), //nolint:noctx // a one-off build
		"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", path, fmt.Sprintf("%dM", sizeMB)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("microvm runtime: mke2fs of a base disk: %v: %s", err, bytes.TrimSpace(out))
	}
	return syncFile(path)
}

// syncFile flushes the file at path to disk: an asset is renamed into place only once whole,
// so that a host crash never leaves a base disk or overlay under its final name half written.
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// openDir opens the directory name below the directory dirfd without following a link.
func openDir(dirfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// mergeDir merges the directory src (of a layer) into dst (of the stage), as overlayfs
// stacks an upper directory on a lower one; rel is their path below the roots, and skip the
// paths below the root to leave out.
func mergeDir(src, dst *os.File, rel string, skip []string) error {
	names, err := src.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	for _, name := range names {
		if slices.Contains(skip, filepath.Join(rel, name)) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if err := mergeEntry(sfd, dfd, name, &st, filepath.Join(rel, name), skip); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(rel, name), err)
		}
	}
	return nil
}

// mergeEntry puts the entry name of the layer directory sfd, whose stat is st, into the stage
// directory dfd.
func mergeEntry(sfd, dfd int, name string, st *unix.Stat_t, rel string, skip []string) error {
	mode := uint32(st.Mode & 0o7777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			return removeAt(dfd, name) // a whiteout: the name is gone from below
		}
		return nil // the image store keeps no other device; the guest has devtmpfs
	case unix.S_IFDIR:
		return mergeSubdir(sfd, dfd, name, st, rel, skip)
	case unix.S_IFREG:
		if err := removeAt(dfd, name); err != nil {
			return err
		}
		err := unix.Linkat(sfd, name, dfd, name, 0)
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EPERM) {
			return copyAt(sfd, dfd, name, st)
		}
		return err
	case unix.S_IFLNK:
		if err := removeAt(dfd, name); err != nil {
			return err
		}
		target, err := readlinkAt(sfd, name)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return err
		}
		return unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	case unix.S_IFIFO:
		if err := removeAt(dfd, name); err != nil {
			return err
		}
		if err := unix.Mkfifoat(dfd, name, mode); err != nil {
			return err
		}
		return unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil // sockets and the like: nothing an image needs
}

// mergeSubdir merges the directory name of the layer directory sfd, whose stat is st, into
// the stage directory dfd: a non-directory there (a link, say) is hidden by it, and an opaque
// one hides everything of the lower layers below it.
func mergeSubdir(sfd, dfd int, name string, st *unix.Stat_t, rel string, skip []string) error {
	var dst unix.Stat_t
	err := unix.Fstatat(dfd, name, &dst, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && dst.Mode&unix.S_IFMT == unix.S_IFDIR:
	case err == nil || errors.Is(err, unix.ENOENT):
		// A non-directory below (a link, say) is hidden by this directory.
		if err := removeAt(dfd, name); err != nil {
			return err
		}
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return err
		}
	default:
		return err
	}
	s, err := openDir(sfd, name)
	if err != nil {
		return err
	}
	defer s.Close()
	d, err := openDir(dfd, name)
	if err != nil {
		return err
	}
	defer d.Close()
	// An opaque directory hides everything below it of the lower layers.
	v := make([]byte, 1)
	if n, err := unix.Fgetxattr(int(s.Fd()), "trusted.overlay.opaque", v); err == nil && n == 1 && v[0] == 'y' {
		if err := clearDir(int(d.Fd())); err != nil {
			return err
		}
	}
	if err := mergeDir(s, d, rel, skip); err != nil {
		return err
	}
	if err := unix.Fchown(int(d.Fd()), int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return unix.Fchmod(int(d.Fd()), uint32(st.Mode&0o7777))
}

// copyAt copies the regular file name of sfd into dfd, with its mode and owner.
func copyAt(sfd, dfd int, name string, st *unix.Stat_t) error {
	in, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	src := os.NewFile(uintptr(in), name)
	defer src.Close()
	out, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	dst := os.NewFile(uintptr(out), name)
	defer dst.Close()
	if _, err := io.Copy(dst, src); err != nil {
		return err
	}
	if err := unix.Fchown(out, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return unix.Fchmod(out, uint32(st.Mode&0o7777))
}

func readlinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// removeAt removes name from the directory dirfd, a directory with everything below it,
// without following a link; a name that is not there is no error.
func removeAt(dirfd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dirfd, name, 0)
	}
	d, err := openDir(dirfd, name)
	if err != nil {
		return err
	}
	err = clearDir(int(d.Fd()))
	d.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// clearDir removes everything in the directory dirfd.
func clearDir(dirfd int) error {
	d, err := openDir(dirfd, ".")
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAt(dirfd, n); err != nil {
			return err
		}
	}
	return nil
}
