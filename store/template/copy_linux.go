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

	"github.com/bothy/bothy/platform"
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

// The walks below go through platform.DirPath: a sandbox's layer may be a tree tens of
// thousands of directories deep, and a walk holding a descriptor per level (or a path per
// level) would run out of descriptors (or memory) there. Each directory is entered relative
// to its parent's descriptor with O_NOFOLLOW; a level whose descriptor was closed is reopened
// as ".." of the one below and checked to be the same directory, so a link or rename planted
// in the layer cannot lead a walk out of it.

// sizeTree sums the sizes of the regular files under dir (each inode once).
func sizeTree(dir *os.File, seen map[inode]bool) (int64, error) {
	p := platform.NewDirPath(dir)
	defer p.Close()
	names, err := readNames(p)
	if err != nil {
		return 0, err
	}
	stack := [][]string{names} // the names still to look at, per level of p
	var total int64
	for {
		top := &stack[len(stack)-1]
		if len(*top) == 0 {
			if len(stack) == 1 {
				return total, nil
			}
			stack = stack[:len(stack)-1]
			if err := p.Pop(); err != nil {
				return 0, err
			}
			continue
		}
		name := (*top)[0]
		*top = (*top)[1:]
		var st unix.Stat_t
		if err := fstatat(p, name, &st); err != nil {
			return 0, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := p.Push(name); err != nil {
				return 0, err
			}
			names, err := readNames(p)
			if err != nil {
				return 0, err
			}
			stack = append(stack, names)
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
}

// copyRoot copies the tree of src into a new directory name under dst (src's own metadata
// becomes name's), fsyncing every file and directory, and returns the bytes of regular files
// copied.
func (c *copier) copyRoot(src, dst *os.File, name string) (int64, error) {
	if err := unix.Mkdirat(int(dst.Fd()), name, 0o700); err != nil {
		return 0, pathErr("mkdir", dst.Name(), name, err)
	}
	return c.fillRoot(src, dst, name, false)
}

// mergeRoot lays the tree of src, an overlayfs upper layer, over the copy already in name
// under dst, so that name holds what overlayfs would show with src above that copy: an entry
// of src replaces the one below (a whiteout, kept, hides it), a directory of src merges into
// the one below unless it is opaque (then it replaces it), and src's root metadata becomes
// name's. It fsyncs what it changes and returns the bytes of regular files copied so far.
func (c *copier) mergeRoot(src, dst *os.File, name string) (int64, error) {
	return c.fillRoot(src, dst, name, true)
}

// fillRoot fills the directory name under dst from src (merging into what it holds, with
// merge), then gives it src's metadata and fsyncs it and dst.
func (c *copier) fillRoot(src, dst *os.File, name string, merge bool) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return 0, &os.PathError{Op: "fstat", Path: src.Name(), Err: err}
	}
	sub, err := openDirAt(dst, name)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	if err := c.fillTree(src, sub, name, merge); err != nil {
		return 0, err
	}
	at := func() string { return filepath.Join(dst.Name(), name) }
	if err := c.applyMeta(int(dst.Fd()), name, int(sub.Fd()), &st, int(src.Fd()), "", at); err != nil {
		return 0, err
	}
	if err := sub.Sync(); err != nil {
		return 0, err
	}
	return c.copied, dst.Sync()
}

// fillFrame is one directory of fillTree's walk: the names of the source directory still to
// copy, whether they merge into an existing copy, and the source directory's status, which
// its copy gets once its content is complete.
type fillFrame struct {
	names []string
	merge bool
	st    unix.Stat_t
}

// fillTree copies the content of src into dst, the copy of src named rootRel under
// c.dstRoot, or with merge lays it over what dst holds (see mergeRoot). Source and copy are
// walked in step, each by a platform.DirPath; the stack holds one fillFrame per level.
func (c *copier) fillTree(src, dst *os.File, rootRel string, merge bool) error {
	s, d := platform.NewDirPath(src), platform.NewDirPath(dst)
	defer s.Close()
	defer d.Close()
	names, err := readNames(s)
	if err != nil {
		return err
	}
	stack := []fillFrame{{names: names, merge: merge}}
	for {
		if err := c.ctx.Err(); errors.Is(err, context.Canceled) {
			return err
		}
		top := &stack[len(stack)-1]
		if len(top.names) == 0 {
			if len(stack) == 1 {
				return nil // the caller gives the root its metadata
			}
			if err := c.finishDir(s, d, &top.st); err != nil {
				return err
			}
			stack = stack[:len(stack)-1]
			if err := errors.Join(s.Pop(), d.Pop()); err != nil {
				return err
			}
			continue
		}
		name := top.names[0]
		top.names = top.names[1:]
		var st unix.Stat_t
		if err := fstatat(s, name, &st); err != nil {
			return err
		}
		enter, mergeInto := false, false
		if top.merge {
			enter, mergeInto, err = c.mergeEntry(s, d, name, &st, rootRel)
		} else {
			enter, err = c.copyEntry(s, d, name, &st, rootRel)
		}
		if err != nil {
			return err
		}
		if !enter {
			continue
		}
		if err := errors.Join(s.Push(name), d.Push(name)); err != nil {
			return err
		}
		names, err := readNames(s)
		if err != nil {
			return err
		}
		stack = append(stack, fillFrame{names: names, merge: mergeInto, st: st})
	}
}

// finishDir gives the copy of the directory the walk is in the metadata of its source (st),
// after its content, so that creating entries does not change the times and a read-only mode
// does not stop the copy, and fsyncs it.
func (c *copier) finishDir(s, d *platform.DirPath, st *unix.Stat_t) error {
	parent, err := d.ParentFd()
	if err != nil {
		return err
	}
	if err := c.applyMeta(parent, d.Name(), d.Fd(), st, s.Fd(), "", func() string { return d.Path("") }); err != nil {
		return err
	}
	if err := unix.Fsync(d.Fd()); err != nil {
		return &os.PathError{Op: "fsync", Path: d.Path(""), Err: err}
	}
	return nil
}

// mergeEntry lays the source entry name (st) over what the copy holds under that name: a
// directory over a directory merges into it (enter, mergeInto) unless the source is opaque;
// anything else replaces what is below.
func (c *copier) mergeEntry(s, d *platform.DirPath, name string, st *unix.Stat_t, rootRel string) (enter, mergeInto bool, _ error) {
	var bst unix.Stat_t // the entry below it, in the copy
	err := fstatat(d, name, &bst)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return false, false, err
	}
	below := err == nil
	if below && st.Mode&unix.S_IFMT == unix.S_IFDIR && bst.Mode&unix.S_IFMT == unix.S_IFDIR {
		opaque, err := isOpaque(s, name)
		if err != nil {
			return false, false, err
		}
		if !opaque {
			return true, true, nil
		}
	}
	if below {
		if err := d.RemoveTree(name); err != nil {
			return false, false, err
		}
	}
	enter, err = c.copyEntry(s, d, name, st, rootRel)
	return enter, false, err
}

// isOpaque says whether the upper layer's directory name hides everything below it
// (overlayfs's trusted.overlay.opaque "y").
func isOpaque(s *platform.DirPath, name string) (bool, error) {
	fd, err := unix.Openat(s.Fd(), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, pathErr("open", s.Path(""), name, err)
	}
	defer unix.Close(fd)
	var b [4]byte
	n, err := unix.Fgetxattr(fd, overlayXattrPrefix+"opaque", b[:])
	switch {
	case err == nil:
		return n == 1 && b[0] == 'y', nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ERANGE):
		return false, nil
	}
	return false, fmt.Errorf("template: read the opaque mark of %s: %w", s.Path(name), err)
}

// copyEntry copies the source entry name (st) of the walk's source directory into its copy.
// A directory is made (empty, owner-only) and reported with enter: the walk fills it.
func (c *copier) copyEntry(s, d *platform.DirPath, name string, st *unix.Stat_t, rootRel string) (enter bool, _ error) {
	dfd := d.Fd()
	at := func() string { return d.Path(name) }
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFDIR && st.Nlink > 1 {
		k := inode{uint64(st.Dev), st.Ino}
		if first, ok := c.links[k]; ok {
			return false, c.linkTo(first, dfd, name, at)
		}
		c.links[k] = filepath.Join(append(append([]string{rootRel}, d.Names()...), name)...)
	}
	switch kind {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			return false, pathErr("mkdir", d.Path(""), name, err)
		}
		return true, nil
	case unix.S_IFREG:
		return false, c.copyFile(s, d, name, st)
	case unix.S_IFLNK:
		target, err := readlinkat(s, name)
		if err != nil {
			return false, err
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return false, pathErr("symlink", d.Path(""), name, err)
		}
		return false, c.applyMeta(dfd, name, -1, st, -1, procPath(s.Fd(), name), at)
	default:
		// Character devices (overlayfs whiteouts are 0/0), block devices, FIFOs and sockets
		// are made anew with the same type and device number.
		if err := unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
			return false, pathErr("mknod", d.Path(""), name, err)
		}
		return false, c.applyMeta(dfd, name, -1, st, -1, procPath(s.Fd(), name), at)
	}
}

// linkTo makes name in the directory dfd a hard link to first, the path (relative to
// c.dstRoot) of the inode's first copy. A path too long for one system call (deep in a deep
// tree) is walked one directory at a time; these are directories of the copy, which only
// bothyd writes.
func (c *copier) linkTo(first string, dfd int, name string, at func() string) error {
	full := filepath.Join(c.dstRoot, first)
	if len(full) < unix.PathMax {
		if err := unix.Linkat(unix.AT_FDCWD, full, dfd, name, 0); err != nil {
			return &os.PathError{Op: "link", Path: at(), Err: err}
		}
		return nil
	}
	fd, err := unix.Open(c.dstRoot, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: c.dstRoot, Err: err}
	}
	parts := strings.Split(first, "/")
	for _, part := range parts[:len(parts)-1] {
		next, err := unix.Openat(fd, part, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return &os.PathError{Op: "open", Path: at(), Err: err}
		}
		fd = next
	}
	defer unix.Close(fd)
	if err := unix.Linkat(fd, parts[len(parts)-1], dfd, name, 0); err != nil {
		return &os.PathError{Op: "link", Path: at(), Err: err}
	}
	return nil
}

func (c *copier) copyFile(s, d *platform.DirPath, name string, st *unix.Stat_t) error {
	sfd, err := unix.Openat(s.Fd(), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathErr("open", s.Path(""), name, err)
	}
	sf := os.NewFile(uintptr(sfd), name)
	defer sf.Close()
	dfd, err := unix.Openat(d.Fd(), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return pathErr("create", d.Path(""), name, err)
	}
	df := os.NewFile(uintptr(dfd), name)
	defer df.Close()
	if err := c.copyData(sf, df); err != nil {
		if errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("template: copy %s: %w", s.Path(name), err)
	}
	if err := c.applyMeta(d.Fd(), name, dfd, st, sfd, "", func() string { return d.Path(name) }); err != nil {
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
			return err
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

// applyMeta gives the entry name in the directory dirfd (open as f when f >= 0, else reached
// through its name) the ownership, mode, xattrs and times of the source entry st (open as sf
// when sf >= 0, else at srcPath). at names the entry for messages.
func (c *copier) applyMeta(dirfd int, name string, f int, st *unix.Stat_t, sf int, srcPath string, at func() string) error {
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	fail := func(op string, err error) error { return &os.PathError{Op: op, Path: at(), Err: err} }
	// Ownership first: chown clears set-id bits and file capabilities, which come back below.
	if int(st.Uid) != c.euid || int(st.Gid) != c.egid {
		var err error
		if f >= 0 {
			err = unix.Fchown(f, int(st.Uid), int(st.Gid))
		} else {
			err = unix.Fchownat(dirfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return fail("chown", err)
		}
	}
	if !isLink {
		mode := st.Mode & 0o7777
		var err error
		if f >= 0 {
			err = unix.Fchmod(f, mode)
		} else {
			err = unix.Fchmodat(dirfd, name, mode, 0)
		}
		if err != nil {
			return fail("chmod", err)
		}
	}
	if err := c.copyXattrs(sf, srcPath, f, procPath(dirfd, name)); err != nil {
		return fmt.Errorf("template: xattrs of %s: %w", at(), err)
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail("utimes", err)
	}
	return nil
}

// copyXattrs copies the extended attributes of the source (open as sf when sf >= 0, else at
// srcPath) to the copy (open as df when df >= 0, else at dstPath).
func (c *copier) copyXattrs(sf int, srcPath string, df int, dstPath string) error {
	list := func(buf []byte) (int, error) {
		if sf >= 0 {
			return unix.Flistxattr(sf, buf)
		}
		return unix.Llistxattr(srcPath, buf)
	}
	get := func(attr string, buf []byte) (int, error) {
		if sf >= 0 {
			return unix.Fgetxattr(sf, attr, buf)
		}
		return unix.Lgetxattr(srcPath, attr, buf)
	}
	set := func(attr string, val []byte) error {
		if df >= 0 {
			return unix.Fsetxattr(df, attr, val, 0)
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

// procPath names the entry name of the directory open at fd through /proc/self/fd, so that
// the path-based xattr calls resolve the directory by its handle, never by a path that a link
// could redirect.
func procPath(fd int, name string) string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, name)
}

func fstatat(p *platform.DirPath, name string, st *unix.Stat_t) error {
	if err := unix.Fstatat(p.Fd(), name, st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathErr("lstat", p.Path(""), name, err)
	}
	return nil
}

func openDirAt(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathErr("open", dir.Name(), name, err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name)), nil
}

func readlinkat(p *platform.DirPath, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(p.Fd(), name, buf)
		if err != nil {
			return "", pathErr("readlink", p.Path(""), name, err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// readNames lists the directory the walk is in from its start, through a fresh handle.
func readNames(p *platform.DirPath) ([]string, error) {
	names, err := platform.ReadNamesFd(p.Fd(), 0)
	if err != nil {
		return nil, &os.PathError{Op: "readdir", Path: p.Path(""), Err: err}
	}
	return names, nil
}

func pathErr(op, dir, name string, err error) error {
	return &os.PathError{Op: op, Path: filepath.Join(dir, name), Err: err}
}
