//go:build linux

package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/bothy/bothy/platform"
	"golang.org/x/sys/unix"
)

// resolveHow resolves a path below a layer's root without ever following a link: a symbolic
// link anywhere on the path fails the resolution with ELOOP (RESOLVE_NO_SYMLINKS), ".." and
// absolute links could not leave the root even if they were followed (RESOLVE_IN_ROOT), and
// the walk stays on the layer's file system (RESOLVE_NO_XDEV).
var resolveHow = unix.OpenHow{
	Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
}

// opaqueXattr marks a directory of an overlay layer whose lower layers' entries are hidden.
const opaqueXattr = "trusted.overlay.opaque"

// whiteoutPrefix and opaqueName are the OCI layer format's whiteouts.
const (
	whiteoutPrefix = ".wh."
	opaqueName     = ".wh..wh..opq"
)

// dirTime is a directory's modification time from its tar header, applied after the whole
// layer is unpacked, because every entry created in a directory changes its time.
type dirTime struct {
	path string
	t    unix.Timespec
}

// unpacker writes one layer's tar stream below root, a directory descriptor of the layer's
// fs directory. Every path is resolved relative to root by [resolveHow]; nothing is ever
// joined into a host path.
type unpacker struct {
	root   int
	limits Limits
	// seen holds the non-directory entries unpacked so far, the only targets a hard link may
	// have: a hard link to anything else (outside the layer, or an entry not yet in the
	// stream) is refused.
	seen     map[string]bool
	dirTimes []dirTime
	stats    UnpackStats
}

// unpackTar unpacks the tar stream r below the directory fsDir and flushes the file system
// it is on (syncfs), so that what it returns nil for is on stable storage. r must already be
// bounded to [Limits.MaxLayerBytes].
func unpackTar(r io.Reader, fsDir *os.File, limits Limits) (UnpackStats, error) {
	u := &unpacker{root: int(fsDir.Fd()), limits: limits, seen: make(map[string]bool)}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.stats, unsafeEntry("", "the layer is not a valid tar archive: %v", err)
		}
		u.stats.Entries++
		if u.stats.Entries > limits.MaxEntries {
			return u.stats, tooLarge("the layer has more than %d entries", limits.MaxEntries)
		}
		if err := u.entry(hdr, tr); err != nil {
			return u.stats, err
		}
	}
	if err := u.applyDirTimes(); err != nil {
		return u.stats, err
	}
	if err := platform.IgnoringEINTR(func() error { return unix.Syncfs(u.root) }); err != nil {
		return u.stats, fmt.Errorf("image: flush the unpacked layer: %w", err)
	}
	return u.stats, nil
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return unsafeEntry(hdr.Name, "%v", err)
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || int64(hdr.Uid) > maxID || int64(hdr.Gid) > maxID {
		return unsafeEntry(hdr.Name, "its owner %d:%d is not a valid uid:gid", hdr.Uid, hdr.Gid)
	}
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if name == "" {
		if hdr.Typeflag != tar.TypeDir {
			return unsafeEntry(hdr.Name, "the layer's root must be a directory")
		}
		return u.rootDir(hdr)
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(hdr, dir, base)
	}
	pfd, err := u.openDir(dir, true)
	if err != nil {
		return unsafeEntry(hdr.Name, "%v", err)
	}
	defer unix.Close(pfd)
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(pfd, hdr, name, base)
	case tar.TypeReg, '\x00':
		return u.file(pfd, hdr, name, base, r)
	case tar.TypeSymlink:
		return u.symlink(pfd, hdr, name, base)
	case tar.TypeLink:
		return u.hardlink(pfd, hdr, name, base)
	case tar.TypeChar, tar.TypeBlock:
		return u.device(pfd, hdr, name, base)
	case tar.TypeFifo:
		return u.fifo(pfd, hdr, name, base)
	}
	return unsafeEntry(hdr.Name, "its tar type %q is not one a layer may hold", hdr.Typeflag)
}

// maxID is the largest uid or gid (-1 as a 32-bit value means "no change" to chown).
const maxID = 1<<32 - 2

// openDir opens the directory rel below the root. With create, missing directories on the
// way are made (mode 0755, owned by root), as tar does for entries whose parents the archive
// does not list. A link or a non-directory on the way is refused, never followed.
func (u *unpacker) openDir(rel string, create bool) (int, error) {
	if rel == "" {
		return unix.Dup(u.root)
	}
	fd, err := openat2(u.root, rel)
	if err == nil || !errors.Is(err, unix.ENOENT) || !create {
		return fd, pathError(rel, err)
	}
	fd, err = unix.Dup(u.root)
	if err != nil {
		return -1, err
	}
	for _, part := range strings.Split(rel, "/") {
		nfd, err := openat2(fd, part)
		if errors.Is(err, unix.ENOENT) {
			if err := platform.IgnoringEINTR(func() error { return unix.Mkdirat(fd, part, 0o755) }); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return -1, pathError(rel, err)
			}
			nfd, err = openat2(fd, part)
			if err == nil {
				err = unix.Fchmod(nfd, 0o755)
			}
		}
		unix.Close(fd)
		if err != nil {
			if nfd >= 0 {
				unix.Close(nfd)
			}
			return -1, pathError(rel, err)
		}
		fd = nfd
	}
	return fd, nil
}

func openat2(dirfd int, rel string) (int, error) {
	how := resolveHow
	for {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if err != unix.EINTR && err != unix.EAGAIN {
			return fd, err
		}
	}
}

// pathError says in words why a path below the root could not be resolved.
func pathError(rel string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("the path %q passes through a symbolic link, which unpacking never follows", rel)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("the path %q passes through something that is not a directory", rel)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("the path %q leads out of the layer", rel)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("this kernel has no openat2 (Linux 5.6 or later is needed to unpack images safely)")
	}
	return fmt.Errorf("resolve %q in the layer: %w", rel, err)
}

// clear makes room for a new entry base in pfd: a non-directory there is removed (a later
// tar entry replaces an earlier one), a directory stays when the new entry is a directory
// too, and an empty directory is removed otherwise. It reports whether what it removed was a
// whiteout, so that a directory replacing one can hide the lower layers' directory as well.
func (u *unpacker) clear(pfd int, name, base string, keepDir bool) (exists, wasWhiteout bool, err error) {
	var st unix.Stat_t
	err = platform.IgnoringEINTR(func() error { return unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) })
	if errors.Is(err, unix.ENOENT) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if isDir && keepDir {
		return true, false, nil
	}
	flags := 0
	if isDir {
		flags = unix.AT_REMOVEDIR
	}
	if err := platform.IgnoringEINTR(func() error { return unix.Unlinkat(pfd, base, flags) }); err != nil {
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return false, false, unsafeEntry(name, "it would replace a directory that is not empty")
		}
		return false, false, err
	}
	delete(u.seen, name)
	return false, st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0, nil
}

// mode is the permission part of a tar mode that a layer keeps. Setuid and setgid are
// dropped from everything but directories (where setgid means "new entries take the
// directory's group" and grants nothing); see the package documentation for why.
func (u *unpacker) mode(hdr *tar.Header, dir bool) uint32 {
	m := uint32(hdr.Mode) & 0o7777
	if dir {
		return m &^ unix.S_ISUID
	}
	if m&(unix.S_ISUID|unix.S_ISGID) != 0 {
		u.stats.StrippedSetuid++
		m &^= unix.S_ISUID | unix.S_ISGID
	}
	return m
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// finish gives the entry base in pfd its owner and times (not following it if it is a link).
func (u *unpacker) finish(pfd int, hdr *tar.Header, base string) error {
	if err := platform.IgnoringEINTR(func() error {
		return unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
	}); err != nil {
		return fmt.Errorf("image: set the owner of %s: %w", hdr.Name, err)
	}
	mt := timespec(hdr.ModTime)
	at := mt
	if !hdr.AccessTime.IsZero() {
		at = timespec(hdr.AccessTime)
	}
	if err := platform.IgnoringEINTR(func() error {
		return unix.UtimesNanoAt(pfd, base, []unix.Timespec{at, mt}, unix.AT_SYMLINK_NOFOLLOW)
	}); err != nil {
		return fmt.Errorf("image: set the times of %s: %w", hdr.Name, err)
	}
	return nil
}

func (u *unpacker) rootDir(hdr *tar.Header) error {
	if err := unix.Fchown(u.root, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(u.root, u.mode(hdr, true)); err != nil {
		return err
	}
	u.dirTimes = append(u.dirTimes, dirTime{path: "", t: timespec(hdr.ModTime)})
	return nil
}

func (u *unpacker) dir(pfd int, hdr *tar.Header, name, base string) error {
	exists, wasWhiteout, err := u.clear(pfd, name, base, true)
	if err != nil {
		return err
	}
	if !exists {
		if err := platform.IgnoringEINTR(func() error { return unix.Mkdirat(pfd, base, 0o700) }); err != nil {
			return fmt.Errorf("image: create %s: %w", hdr.Name, err)
		}
	}
	fd, err := openat2(pfd, base)
	if err != nil {
		return unsafeEntry(hdr.Name, "%v", pathError(name, err))
	}
	defer unix.Close(fd)
	if wasWhiteout {
		// A directory that replaces a whiteout of the same layer hides the lower layers'
		// directory, as the whiteout did: it is opaque.
		if err := unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("image: mark %s opaque: %w", hdr.Name, err)
		}
	}
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("image: set the owner of %s: %w", hdr.Name, err)
	}
	if err := unix.Fchmod(fd, u.mode(hdr, true)); err != nil {
		return fmt.Errorf("image: set the mode of %s: %w", hdr.Name, err)
	}
	u.dirTimes = append(u.dirTimes, dirTime{path: name, t: timespec(hdr.ModTime)})
	return nil
}

func (u *unpacker) file(pfd int, hdr *tar.Header, name, base string, r io.Reader) error {
	if _, _, err := u.clear(pfd, name, base, false); err != nil {
		return err
	}
	fd, err := platform.OpenatRetry(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("image: create %s: %w", hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	n, err := io.Copy(f, r)
	if err != nil {
		return err
	}
	u.stats.Bytes += n
	// The owner first: chown clears setuid and setgid, and the mode is the last word.
	if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("image: set the owner of %s: %w", hdr.Name, err)
	}
	if err := unix.Fchmod(fd, u.mode(hdr, false)); err != nil {
		return fmt.Errorf("image: set the mode of %s: %w", hdr.Name, err)
	}
	u.seen[name] = true
	return u.finish(pfd, hdr, base)
}

func (u *unpacker) symlink(pfd int, hdr *tar.Header, name, base string) error {
	target := hdr.Linkname
	if target == "" || strings.ContainsRune(target, 0) || len(target) > maxPath {
		return unsafeEntry(hdr.Name, "its link target is empty, has a NUL byte or is too long")
	}
	if _, _, err := u.clear(pfd, name, base, false); err != nil {
		return err
	}
	// The target is kept as written, absolute or with "..": it is resolved only inside a
	// sandbox, whose root is the image, and never by the host (unpacking never follows a link).
	if err := platform.IgnoringEINTR(func() error { return unix.Symlinkat(target, pfd, base) }); err != nil {
		return fmt.Errorf("image: create %s: %w", hdr.Name, err)
	}
	u.seen[name] = true
	return u.finish(pfd, hdr, base)
}

func (u *unpacker) hardlink(pfd int, hdr *tar.Header, name, base string) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return unsafeEntry(hdr.Name, "its hard link target: %v", err)
	}
	if !u.seen[target] || target == name {
		return unsafeEntry(hdr.Name, "it is a hard link to %q, which is not an earlier file of this layer", hdr.Linkname)
	}
	tdir, tbase := path.Split(target)
	tfd, err := u.openDir(strings.TrimSuffix(tdir, "/"), false)
	if err != nil {
		return unsafeEntry(hdr.Name, "its hard link target: %v", err)
	}
	defer unix.Close(tfd)
	if _, _, err := u.clear(pfd, name, base, false); err != nil {
		return err
	}
	// Flags 0: if the target is a symbolic link, the new name links the link, not what it
	// points to.
	if err := platform.IgnoringEINTR(func() error { return unix.Linkat(tfd, tbase, pfd, base, 0) }); err != nil {
		return fmt.Errorf("image: link %s: %w", hdr.Name, err)
	}
	u.seen[name] = true
	return nil
}

// device keeps a character device 0/0, which is an overlay whiteout and means what the
// layer's ".wh." entry for it would mean, and skips every other device node: no image needs
// one (bothyd gives each sandbox its own /dev), and the overlay is mounted nodev anyway.
func (u *unpacker) device(pfd int, hdr *tar.Header, name, base string) error {
	if hdr.Typeflag != tar.TypeChar || hdr.Devmajor != 0 || hdr.Devminor != 0 {
		u.stats.SkippedDevices++
		return nil
	}
	if _, _, err := u.clear(pfd, name, base, false); err != nil {
		return err
	}
	if err := platform.IgnoringEINTR(func() error { return unix.Mknodat(pfd, base, unix.S_IFCHR, 0) }); err != nil {
		return fmt.Errorf("image: create the whiteout %s: %w", hdr.Name, err)
	}
	u.stats.Whiteouts++
	u.seen[name] = true
	return u.finish(pfd, hdr, base)
}

func (u *unpacker) fifo(pfd int, hdr *tar.Header, name, base string) error {
	if _, _, err := u.clear(pfd, name, base, false); err != nil {
		return err
	}
	if err := platform.IgnoringEINTR(func() error { return unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0) }); err != nil {
		return fmt.Errorf("image: create %s: %w", hdr.Name, err)
	}
	if err := u.finish(pfd, hdr, base); err != nil {
		return err
	}
	// fchmodat follows a final link, but base was made a FIFO just above in a directory
	// that only bothyd can write.
	if err := platform.IgnoringEINTR(func() error { return unix.Fchmodat(pfd, base, u.mode(hdr, false), 0) }); err != nil {
		return fmt.Errorf("image: set the mode of %s: %w", hdr.Name, err)
	}
	u.seen[name] = true
	return nil
}

// whiteout turns an OCI whiteout entry into its overlay form: ".wh..wh..opq" marks its
// directory opaque, ".wh.<name>" becomes a character device 0/0 named <name>. A whiteout of
// "", "." or "..", and the other ".wh..wh." names that the format reserves, are refused.
func (u *unpacker) whiteout(hdr *tar.Header, dir, base string) error {
	if base == opaqueName {
		fd, err := u.openDir(dir, true)
		if err != nil {
			return unsafeEntry(hdr.Name, "%v", err)
		}
		defer unix.Close(fd)
		if err := unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("image: mark %q opaque: %w", dir, err)
		}
		u.stats.Opaques++
		return nil
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if strings.HasPrefix(base, opaqueName[:len(whiteoutPrefix)*2]) {
		return unsafeEntry(hdr.Name, "the whiteout name %q is reserved by the OCI layer format", base)
	}
	if target == "" || target == "." || target == ".." {
		return unsafeEntry(hdr.Name, "it is a whiteout of %q, which names no entry of the directory", target)
	}
	pfd, err := u.openDir(dir, true)
	if err != nil {
		return unsafeEntry(hdr.Name, "%v", err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	err = platform.IgnoringEINTR(func() error { return unix.Fstatat(pfd, target, &st, unix.AT_SYMLINK_NOFOLLOW) })
	if err == nil {
		// A whiteout hides only the lower layers' entry; one of this layer stays (OCI image
		// spec, "Whiteouts").
		return nil
	}
	if !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := platform.IgnoringEINTR(func() error { return unix.Mknodat(pfd, target, unix.S_IFCHR, 0) }); err != nil {
		return fmt.Errorf("image: create the whiteout %s: %w", hdr.Name, err)
	}
	u.stats.Whiteouts++
	return nil
}

// applyDirTimes sets the directories' times from their headers, deepest last-seen first, now
// that nothing more is created in them.
func (u *unpacker) applyDirTimes() error {
	for i := len(u.dirTimes) - 1; i >= 0; i-- {
		d := u.dirTimes[i]
		dir, base := path.Split(d.path)
		if d.path == "" {
			dir, base = "", "."
		}
		pfd, err := u.openDir(strings.TrimSuffix(dir, "/"), false)
		if err != nil {
			return err
		}
		err = platform.IgnoringEINTR(func() error {
			return unix.UtimesNanoAt(pfd, base, []unix.Timespec{d.t, d.t}, unix.AT_SYMLINK_NOFOLLOW)
		})
		unix.Close(pfd)
		if err != nil {
			return fmt.Errorf("image: set the times of %q: %w", d.path, err)
		}
	}
	return nil
}

// renameNoReplace renames old to new in dir, failing with fs.ErrExist if new exists.
func renameNoReplace(dir *os.File, old, new string) error {
	err := platform.IgnoringEINTR(func() error {
		return unix.Renameat2(int(dir.Fd()), old, int(dir.Fd()), new, unix.RENAME_NOREPLACE)
	})
	if errors.Is(err, unix.ENOTEMPTY) {
		err = unix.EEXIST
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: old, New: new, Err: err}
	}
	return nil
}
