//go:build linux

package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The tree copy and removal need system calls that package platform does not wrap (mknodat,
// linkat, the xattr calls, utimensat, copy_file_range); they are used here only on
// directories the template store made or on a stopped sandbox's layer reached through
// no-follow directory handles.

// overlayXattrPrefix names the xattrs overlayfs keeps in a layer (opaque directories,
// redirects): a layer copied without them is a different layer, so failing to set one fails
// the copy, where other xattrs are copied only where the file system allows.
const overlayXattrPrefix = "trusted.overlay."

type inode struct{ dev, ino uint64 }

// copier copies a directory tree with its metadata.
type copier struct {
	ctx      context.Context
	progress func(copied, total int64)
	total    int64
	copied   int64
	// links maps a source inode with more than one link to the path (relative to dstRoot) of
	// its first copy, so that later names become hard links too.
	links   map[inode]string
	dstRoot string
	euid    int
	egid    int
	buf     []byte
}

// sizeTree sums the sizes of the regular files under dir (each inode once).
func sizeTree(dir *os.File, seen map[inode]bool) (int64, error) {
	names, err := readNames(dir)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, name := range names {
		var st unix.Stat_t
		if err := fstatat(dir, name, &st); err != nil {
			return 0, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			sub, err := openDirAt(dir, name)
			if err != nil {
				return 0, err
			}
			n, err := sizeTree(sub, seen)
			sub.Close()
			if err != nil {
				return 0, err
			}
			total += n
		case unix.S_IFREG:
			if st.Nlink > 1 {
				k := inode{uint64(st.Dev), st.Ino}
				if seen[k] {
					continue
				}
				seen[k] = true
			}
			total += st.Size
		}
	}
	return total, nil
}

// copyRoot copies the tree of src into a new directory name under dst (src's own metadata
// becomes name's), fsyncing every file and directory, and returns the bytes of regular files
// copied.
func (c *copier) copyRoot(src, dst *os.File, name string) (int64, error) {
	if err := unix.Mkdirat(int(dst.Fd()), name, 0o700); err != nil {
		return 0, pathErr("mkdir", dst, name, err)
	}
	return c.fillRoot(src, dst, name, c.copyDir)
}

// mergeRoot lays the tree of src, an overlayfs upper layer, over the copy already in name
// under dst, so that name holds what overlayfs would show with src above that copy: an entry
// of src replaces the one below (a whiteout, kept, hides it), a directory of src merges into
// the one below unless it is opaque (then it replaces it), and src's root metadata becomes
// name's. It fsyncs what it changes and returns the bytes of regular files copied so far.
func (c *copier) mergeRoot(src, dst *os.File, name string) (int64, error) {
	return c.fillRoot(src, dst, name, c.mergeDir)
}

// fillRoot fills the directory name under dst from src with fill, then gives it src's
// metadata and fsyncs it and dst.
func (c *copier) fillRoot(src, dst *os.File, name string, fill func(src, dst *os.File, rel string) error) (int64, error) {
	var st unix.Stat_t
	if err := fstat(src, &st); err != nil {
		return 0, err
	}
	sub, err := openDirAt(dst, name)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	if err := fill(src, sub, name); err != nil {
		return 0, err
	}
	if err := c.applyMeta(dst, name, sub, &st, src, ""); err != nil {
		return 0, err
	}
	if err := sub.Sync(); err != nil {
		return 0, err
	}
	return c.copied, dst.Sync()
}

func (c *copier) mergeDir(src, dst *os.File, rel string) error {
	if err := c.ctx.Err(); errors.Is(err, context.Canceled) {
		return err
	}
	names, err := readNames(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		var st, bst unix.Stat_t // the entry in src, and the one below it in dst
		if err := fstatat(src, name, &st); err != nil {
			return err
		}
		err := fstatat(dst, name, &bst)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		below := err == nil
		if below && st.Mode&unix.S_IFMT == unix.S_IFDIR && bst.Mode&unix.S_IFMT == unix.S_IFDIR {
			ssub, err := openDirAt(src, name)
			if err != nil {
				return err
			}
			opaque, err := isOpaque(ssub)
			if err != nil {
				ssub.Close()
				return err
			}
			if !opaque {
				err = c.mergeInto(ssub, dst, name, rel+"/"+name, &st)
				ssub.Close()
				if err != nil {
					return err
				}
				continue
			}
			ssub.Close()
		}
		if below {
			if err := removeTree(dst, name); err != nil {
				return err
			}
		}
		if err := c.copyEntry(src, dst, name, rel+"/"+name); err != nil {
			return err
		}
	}
	return nil
}

// mergeInto merges the directory ssub into dst's directory name, then gives it ssub's
// metadata (st).
func (c *copier) mergeInto(ssub, dst *os.File, name, rel string, st *unix.Stat_t) error {
	dsub, err := openDirAt(dst, name)
	if err != nil {
		return err
	}
	defer dsub.Close()
	if err := c.mergeDir(ssub, dsub, rel); err != nil {
		return err
	}
	if err := c.applyMeta(dst, name, dsub, st, ssub, ""); err != nil {
		return err
	}
	return dsub.Sync()
}

// isOpaque says whether an upper layer's directory hides everything below it (overlayfs's
// trusted.overlay.opaque "y").
func isOpaque(dir *os.File) (bool, error) {
	var b [4]byte
	n, err := unix.Fgetxattr(int(dir.Fd()), overlayXattrPrefix+"opaque", b[:])
	switch {
	case err == nil:
		return n == 1 && b[0] == 'y', nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ERANGE):
		return false, nil
	}
	return false, fmt.Errorf("template: read the opaque mark of %s: %w", dir.Name(), err)
}

func (c *copier) copyDir(src, dst *os.File, rel string) error {
	if err := c.ctx.Err(); errors.Is(err, context.Canceled) {
		return err
	}
	names, err := readNames(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := c.copyEntry(src, dst, name, rel+"/"+name); err != nil {
			return err
		}
	}
	return nil
}

func (c *copier) copyEntry(src, dst *os.File, name, rel string) error {
	var st unix.Stat_t
	if err := fstatat(src, name, &st); err != nil {
		return err
	}
	dfd := int(dst.Fd())
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFDIR && st.Nlink > 1 {
		k := inode{uint64(st.Dev), st.Ino}
		if first, ok := c.links[k]; ok {
			if err := unix.Linkat(unix.AT_FDCWD, filepath.Join(c.dstRoot, first), dfd, name, 0); err != nil {
				return pathErr("link", dst, name, err)
			}
			return nil
		}
		c.links[k] = rel
	}
	switch kind {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return pathErr("mkdir", dst, name, err)
		}
		ssub, err := openDirAt(src, name)
		if err != nil {
			return err
		}
		defer ssub.Close()
		dsub, err := openDirAt(dst, name)
		if err != nil {
			return err
		}
		defer dsub.Close()
		if err := c.copyDir(ssub, dsub, rel); err != nil {
			return err
		}
		// Metadata after the content, so that creating entries does not change the times and a
		// read-only mode does not stop the copy.
		if err := c.applyMeta(dst, name, dsub, &st, ssub, ""); err != nil {
			return err
		}
		return dsub.Sync()
	case unix.S_IFREG:
		return c.copyFile(src, dst, name, &st)
	case unix.S_IFLNK:
		target, err := readlinkat(src, name)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return pathErr("symlink", dst, name, err)
		}
		return c.applyMeta(dst, name, nil, &st, nil, procPath(src, name))
	default:
		// Character devices (overlayfs whiteouts are 0/0), block devices, FIFOs and sockets
		// are made anew with the same type and device number.
		if err := unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
			return pathErr("mknod", dst, name, err)
		}
		return c.applyMeta(dst, name, nil, &st, nil, procPath(src, name))
	}
}

func (c *copier) copyFile(src, dst *os.File, name string, st *unix.Stat_t) error {
	sfd, err := unix.Openat(int(src.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathErr("open", src, name, err)
	}
	sf := os.NewFile(uintptr(sfd), filepath.Join(src.Name(), name))
	defer sf.Close()
	dfd, err := unix.Openat(int(dst.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return pathErr("create", dst, name, err)
	}
	df := os.NewFile(uintptr(dfd), filepath.Join(dst.Name(), name))
	defer df.Close()
	if err := c.copyData(sf, df); err != nil {
		return err
	}
	if err := c.applyMeta(dst, name, df, st, sf, ""); err != nil {
		return err
	}
	return df.Sync()
}

// copyData copies the content with copy_file_range (reflinks where the file system has them),
// falling back to read and write across file systems that refuse it.
func (c *copier) copyData(sf, df *os.File) error {
	const chunk = 4 << 20
	sfd, dfd := int(sf.Fd()), int(df.Fd())
	useRange := true
	for {
		if err := c.ctx.Err(); errors.Is(err, context.Canceled) {
			return err
		}
		var n int
		var err error
		if useRange {
			n, err = unix.CopyFileRange(sfd, nil, dfd, nil, chunk, 0)
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				useRange = false
				continue
			}
			if errors.Is(err, unix.EINTR) {
				continue
			}
		} else {
			if c.buf == nil {
				c.buf = make([]byte, 1<<20)
			}
			n, err = sf.Read(c.buf)
			if n > 0 {
				if _, werr := df.Write(c.buf[:n]); werr != nil {
					return werr
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
		}
		if err != nil {
			return fmt.Errorf("template: copy %s: %w", sf.Name(), err)
		}
		if n == 0 {
			return nil
		}
		c.copied += int64(n)
		if c.progress != nil {
			c.progress(c.copied, max(c.total, c.copied))
		}
	}
}

// applyMeta gives the entry name in dir (opened as f when f is not nil, else reached through
// path) the ownership, mode, xattrs and times of the source entry st (opened as sf, or at
// srcPath).
func (c *copier) applyMeta(dir *os.File, name string, f *os.File, st *unix.Stat_t, sf *os.File, srcPath string) error {
	dfd := int(dir.Fd())
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	// Ownership first: chown clears set-id bits and file capabilities, which come back below.
	if int(st.Uid) != c.euid || int(st.Gid) != c.egid {
		var err error
		if f != nil {
			err = unix.Fchown(int(f.Fd()), int(st.Uid), int(st.Gid))
		} else {
			err = unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return pathErr("chown", dir, name, err)
		}
	}
	if !isLink {
		mode := st.Mode & 0o7777
		var err error
		if f != nil {
			err = unix.Fchmod(int(f.Fd()), mode)
		} else {
			err = unix.Fchmodat(dfd, name, mode, 0)
		}
		if err != nil {
			return pathErr("chmod", dir, name, err)
		}
	}
	if err := c.copyXattrs(sf, srcPath, f, procPath(dir, name)); err != nil {
		return fmt.Errorf("template: xattrs of %s: %w", filepath.Join(dir.Name(), name), err)
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathErr("utimes", dir, name, err)
	}
	return nil
}

func (c *copier) copyXattrs(sf *os.File, srcPath string, df *os.File, dstPath string) error {
	list := func(buf []byte) (int, error) {
		if sf != nil {
			return unix.Flistxattr(int(sf.Fd()), buf)
		}
		return unix.Llistxattr(srcPath, buf)
	}
	get := func(attr string, buf []byte) (int, error) {
		if sf != nil {
			return unix.Fgetxattr(int(sf.Fd()), attr, buf)
		}
		return unix.Lgetxattr(srcPath, attr, buf)
	}
	set := func(attr string, val []byte) error {
		if df != nil {
			return unix.Fsetxattr(int(df.Fd()), attr, val, 0)
		}
		return unix.Lsetxattr(dstPath, attr, val, 0)
	}
	names, err := xattrRead(list)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil
		}
		return err
	}
	for _, attr := range strings.Split(strings.TrimRight(string(names), "\x00"), "\x00") {
		if attr == "" {
			continue
		}
		val, err := xattrRead(func(buf []byte) (int, error) { return get(attr, buf) })
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return fmt.Errorf("get %s: %w", attr, err)
		}
		if err := set(attr, val); err != nil {
			if !strings.HasPrefix(attr, overlayXattrPrefix) && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EACCES)) {
				continue
			}
			return fmt.Errorf("set %s: %w", attr, err)
		}
	}
	return nil
}

// xattrRead calls a size-probing xattr call until the buffer is large enough.
func xattrRead(call func(buf []byte) (int, error)) ([]byte, error) {
	for {
		n, err := call(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]byte, n)
		m, err := call(buf)
		if errors.Is(err, unix.ERANGE) {
			continue // it grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		return buf[:m], nil
	}
}

// procPath names the entry name of the open directory dir through /proc/self/fd, so that the
// path-based xattr calls resolve the directory by its handle, never by a path that a link
// could redirect.
func procPath(dir *os.File, name string) string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), name)
}

func fstat(f *os.File, st *unix.Stat_t) error {
	if err := unix.Fstat(int(f.Fd()), st); err != nil {
		return &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	return nil
}

func fstatat(dir *os.File, name string, st *unix.Stat_t) error {
	if err := unix.Fstatat(int(dir.Fd()), name, st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathErr("lstat", dir, name, err)
	}
	return nil
}

func openDirAt(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathErr("open", dir, name, err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name)), nil
}

func readlinkat(dir *os.File, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return "", pathErr("readlink", dir, name, err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// readNames lists a directory from its start through a fresh handle.
func readNames(dir *os.File) ([]string, error) {
	d, err := openDirAt(dir, ".")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

func pathErr(op string, dir *os.File, name string, err error) error {
	return &os.PathError{Op: op, Path: filepath.Join(dir.Name(), name), Err: err}
}

// renameAt renames old to new within dir; new must not exist.
func renameAt(dir *os.File, old, new string) error {
	if err := unix.Renameat2(int(dir.Fd()), old, int(dir.Fd()), new, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			if _, serr := os.Lstat(filepath.Join(dir.Name(), new)); serr == nil {
				return pathErr("rename", dir, new, unix.EEXIST)
			}
			err = unix.Renameat(int(dir.Fd()), old, int(dir.Fd()), new)
		}
		if err != nil {
			return &os.LinkError{Op: "rename", Old: filepath.Join(dir.Name(), old), New: filepath.Join(dir.Name(), new), Err: err}
		}
	}
	return nil
}

// removeTree removes the entry name in dir and, if it is a directory, everything under it,
// never following a link. A directory whose mode keeps its owner out is opened up first, so
// that a copied read-only directory can be removed also without root.
func removeTree(dir *os.File, name string) error {
	err := unix.Unlinkat(int(dir.Fd()), name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return pathErr("remove", dir, name, err)
	}
	var st unix.Stat_t
	if err := fstatat(dir, name, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return pathErr("remove", dir, name, err)
	}
	if st.Mode&0o700 != 0o700 {
		if err := unix.Fchmodat(int(dir.Fd()), name, 0o700, 0); err != nil {
			return pathErr("chmod", dir, name, err)
		}
	}
	sub, err := openDirAt(dir, name)
	if err != nil {
		return err
	}
	names, err := readNames(sub)
	if err == nil {
		for _, n := range names {
			if err = removeTree(sub, n); err != nil {
				break
			}
		}
	}
	sub.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(int(dir.Fd()), name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return pathErr("rmdir", dir, name, err)
	}
	return nil
}
