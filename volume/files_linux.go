//go:build linux

package volume

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
)

// resolve is how every path of a volume's files is resolved: inside the volume's root (no
// link leads out), no /proc magic link, never onto another file system.
const resolve = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// volRoot is an open volume root, held until release.
type volRoot struct {
	fd      int
	release func()
}

// openRoot opens the volume's mounted root for file operations, holding off its deletion
// until release. The root must be a file system of its own: with the mount gone, the mount
// point is a directory of the state root's, which no write may reach.
func (s *Store) openRoot(name string) (*volRoot, error) {
	if CheckName(name) != nil {
		return nil, notFound(name)
	}
	fl := s.fileLock(name)
	fl.RLock()
	v, err := s.readRecord(name)
	if err == nil && (v == nil || v.State != StateReady) {
		err = notFound(name)
	}
	if err != nil {
		fl.RUnlock()
		return nil, err
	}
	if ok, merr := s.mounted(name); merr != nil || !ok {
		// Mounted again under the store's lock (a mount that went, by an operator's hand).
		if merr == nil {
			if unlock, lerr := s.lock(); lerr == nil {
				merr = s.mount(name)
				unlock()
			} else {
				merr = lerr
			}
		}
		if merr != nil {
			fl.RUnlock()
			return nil, errcode.Wrap(errcode.Unavailable, merr, "Volume %s is not mounted on the server; retry, or run bothyd check --repair.", name)
		}
	}
	fd, err := unix.Open(s.MountDir(name), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		fl.RUnlock()
		return nil, err
	}
	var a, b unix.Stat_t
	serr := unix.Fstat(fd, &a)
	if serr == nil {
		serr = unix.Lstat(filepath.Join(s.dir, name), &b)
	}
	if serr != nil || a.Dev == b.Dev {
		unix.Close(fd)
		fl.RUnlock()
		return nil, errcode.New(errcode.Unavailable, "Volume %s is not mounted on the server; retry, or run bothyd check --repair.", name)
	}
	var once sync.Once
	return &volRoot{fd: fd, release: func() { once.Do(func() { unix.Close(fd); fl.RUnlock() }) }}, nil
}

// relPath cleans an API path into one relative to the volume's root ("." for the root).
func relPath(p string) (string, error) {
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", errcode.Invalid("path", "The path must be at most 4096 bytes, without NUL bytes.")
	}
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

// openIn opens rel below the root fd.
func openIn(root int, rel string, flags int, mode uint32) (int, error) {
	for try := 0; ; try++ {
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve})
		if err == unix.EINTR || (err == unix.EAGAIN && try < 16) {
			continue
		}
		return fd, err
	}
}

// fault turns a system call's error on the volume's path p into the API's.
func fault(name, p string, err error) error {
	var e *errcode.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e):
		return err
	case errors.Is(err, unix.ENOENT):
		return errcode.Wrap(errcode.FileNotFound, err, "Volume %s has no file %q.", name, trunc(p))
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return errcode.Wrap(CodeFull, err, "Volume %s is full; remove files from it, or make a larger volume and copy them over.", name)
	case errors.Is(err, unix.ELOOP):
		return &errcode.Error{Code: errcode.SymlinkLoop, Field: "path", Err: err,
			Msg: fmt.Sprintf("%q in volume %s is a symbolic link, which the files API does not follow (or a loop of links); name its target instead.", trunc(p), name)}
	case errors.Is(err, unix.ENOTDIR):
		return &errcode.Error{Code: errcode.NotADirectory, Field: "path", Err: err,
			Msg: fmt.Sprintf("A component of %q in volume %s is not a directory.", trunc(p), name)}
	case errors.Is(err, unix.EISDIR):
		return &errcode.Error{Code: errcode.IsADirectory, Field: "path", Err: err,
			Msg: fmt.Sprintf("%q in volume %s is a directory; list it instead.", trunc(p), name)}
	case errors.Is(err, unix.ENOTEMPTY):
		return &errcode.Error{Code: errcode.DirectoryNotEmpty, Field: "path", Err: err,
			Msg: fmt.Sprintf("%q in volume %s is a directory that is not empty; remove it with recursive=true.", trunc(p), name)}
	case errors.Is(err, unix.EEXIST):
		return &errcode.Error{Code: errcode.FileExists, Field: "path", Err: err,
			Msg: fmt.Sprintf("Something that is not a directory is in the way of %q in volume %s.", trunc(p), name)}
	case errors.Is(err, unix.EXDEV), errors.Is(err, platform.ErrOtherDevice):
		return &errcode.Error{Code: errcode.MountInside, Field: "path", Err: err,
			Msg: fmt.Sprintf("%q in volume %s leads onto another file system, which the files API does not enter.", trunc(p), name)}
	case errors.Is(err, platform.ErrTreeChanged):
		return &errcode.Error{Code: errcode.FileChanged, Field: "path", Err: err,
			Msg: fmt.Sprintf("The tree at %q in volume %s changed while it was removed; repeat the request.", trunc(p), name)}
	case errors.Is(err, unix.ENAMETOOLONG):
		return &errcode.Error{Code: errcode.NameTooLong, Field: "path", Err: err,
			Msg: fmt.Sprintf("A name in %q is longer than a volume's file system holds (255 bytes).", trunc(p))}
	}
	return fmt.Errorf("volume %s: %q: %w", name, trunc(p), err)
}

func entryOf(name, p string, st *unix.Stat_t) Entry {
	e := Entry{
		Name: name, Path: p, Size: st.Size, Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid,
		ModTime: time.Unix(st.Mtim.Unix()).UTC(), ATime: time.Unix(st.Atim.Unix()).UTC(), CTime: time.Unix(st.Ctim.Unix()).UTC(),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = "file"
	case unix.S_IFDIR:
		e.Type = "directory"
	case unix.S_IFLNK:
		e.Type = "symlink"
	default:
		e.Type = "other"
	}
	return e
}

func apiPath(rel string) string {
	if rel == "." {
		return "/"
	}
	return "/" + rel
}

// parentOf resolves rel's parent directory (opened for *at calls and reading) and returns
// it with rel's last name. The root itself has no parent.
func parentOf(vname string, root int, rel string) (int, string, error) {
	if rel == "." {
		return -1, "", errcode.Invalid("path", "The path must name something below the volume's root.")
	}
	fd, err := openIn(root, path.Dir(rel), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", fault(vname, apiPath(path.Dir(rel)), err)
	}
	return fd, path.Base(rel), nil
}

// Stat describes the file at p, a link itself rather than its target.
func (s *Store) Stat(name, p string) (*Entry, error) {
	r, err := s.openRoot(name)
	if err != nil {
		return nil, err
	}
	defer r.release()
	rel, err := relPath(p)
	if err != nil {
		return nil, err
	}
	fd, err := openIn(r.fd, rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "", &st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	e := entryOf(path.Base(apiPath(rel)), apiPath(rel), &st)
	if e.Type == "symlink" {
		e.Target = readlink(fd)
	}
	return &e, nil
}

func readlink(fd int) string {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// ListDir lists the directory at p, at most MaxListEntries entries.
func (s *Store) ListDir(name, p string) ([]Entry, error) {
	r, err := s.openRoot(name)
	if err != nil {
		return nil, err
	}
	defer r.release()
	rel, err := relPath(p)
	if err != nil {
		return nil, err
	}
	fd, err := openIn(r.fd, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	defer unix.Close(fd)
	names, err := platform.ReadNamesFd(fd, MaxListEntries)
	if err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	out := make([]Entry, 0, len(names))
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		e := entryOf(n, path.Join(apiPath(rel), n), &st)
		if e.Type == "symlink" {
			if lfd, err := unix.Openat(fd, n, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
				e.Target = readlink(lfd)
				unix.Close(lfd)
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// Open opens the regular file at p for reading and returns it with its size; the volume's
// deletion waits until it is closed. A link, FIFO, device node or socket is refused.
func (s *Store) Open(name, p string) (io.ReadCloser, int64, error) {
	r, err := s.openRoot(name)
	if err != nil {
		return nil, 0, err
	}
	rel, err := relPath(p)
	if err != nil {
		r.release()
		return nil, 0, err
	}
	fd, err := openIn(r.fd, rel, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		r.release()
		if errors.Is(err, unix.ELOOP) {
			// The final component is a link: not a regular file, and not followed.
			return nil, 0, &errcode.Error{Code: errcode.NotARegularFile, Field: "path", Err: err,
				Msg: fmt.Sprintf("%q in volume %s is a symbolic link, which the files API does not follow; name its target instead.", trunc(p), name)}
		}
		return nil, 0, fault(name, apiPath(rel), err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		r.release()
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.EISDIR
		} else if err == nil {
			err = &errcode.Error{Code: errcode.NotARegularFile, Field: "path",
				Msg: fmt.Sprintf("%q in volume %s is not a regular file (a FIFO, a device or a socket); only regular files are read.", trunc(p), name)}
		}
		return nil, 0, fault(name, apiPath(rel), err)
	}
	f := os.NewFile(uintptr(fd), apiPath(rel))
	return &rootedFile{LimitedReader: io.LimitedReader{R: f, N: st.Size}, f: f, release: r.release}, st.Size, nil
}

// rootedFile is an opened volume file, read up to its size at the open.
type rootedFile struct {
	io.LimitedReader
	f       *os.File
	release func()
}

// WriteTo hands the writer the file itself (behind its limit), so that a writer that reads
// from files (an HTTP response on a TCP connection: sendfile) copies without this process
// reading the bytes.
func (r *rootedFile) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, &r.LimitedReader) }

func (r *rootedFile) Close() error {
	err := r.f.Close()
	r.release()
	return err
}

// mkdirs makes rel (a directory) and its missing parents below root, each owned as o says,
// and returns it open.
func mkdirs(vname string, root int, rel string, o WriteOptions, parents bool) (int, error) {
	uid, gid := o.owner()
	mode := uint32(0o755)
	if o.Mode != nil {
		mode = *o.Mode & 0o7777
	}
	cur, err := openIn(root, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		return cur, nil
	}
	parts := strings.Split(rel, "/")
	prefix := ""
	for i, part := range parts {
		prefix = path.Join(prefix, part)
		next, err := openIn(root, prefix, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if errors.Is(err, unix.ENOENT) && (parents || i == len(parts)-1) {
			merr := unix.Mkdirat(cur, part, mode)
			if merr == nil {
				if err := unix.Fchownat(cur, part, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					unix.Close(cur)
					return -1, err
				}
				// mkdir's mode passes the umask; the mode asked for is the mode given.
				if nfd, err := unix.Openat(cur, part, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
					err = unix.Fchmod(nfd, mode)
					unix.Close(nfd)
					if err != nil {
						unix.Close(cur)
						return -1, err
					}
				}
			} else if !errors.Is(merr, unix.EEXIST) {
				unix.Close(cur)
				return -1, merr
			}
			next, err = openIn(root, prefix, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		}
		unix.Close(cur)
		if err != nil {
			return -1, fault(vname, apiPath(prefix), err)
		}
		cur = next
	}
	return cur, nil
}

// Mkdir makes the directory at p (with its missing parents when o.Parents); one that exists
// is no error.
func (s *Store) Mkdir(name, p string, o WriteOptions) (*Entry, error) {
	r, err := s.openRoot(name)
	if err != nil {
		return nil, err
	}
	defer r.release()
	rel, err := relPath(p)
	if err != nil {
		return nil, err
	}
	fd, err := mkdirs(name, r.fd, rel, o, o.Parents)
	if err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	e := entryOf(path.Base(apiPath(rel)), apiPath(rel), &st)
	return &e, nil
}

// Write writes the regular file at p from body, streamed: into a new file beside it, renamed
// over it once whole, so that a reader never sees half of it and a link or special file at p
// is replaced, never written through. A volume that fills is volume-full.
func (s *Store) Write(name, p string, body io.Reader, o WriteOptions) (*Entry, error) {
	r, err := s.openRoot(name)
	if err != nil {
		return nil, err
	}
	defer r.release()
	rel, err := relPath(p)
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return nil, errcode.Invalid("path", "The path must name a file below the volume's root.")
	}
	dir, err := mkdirs(name, r.fd, path.Dir(rel), WriteOptions{UID: o.UID, GID: o.GID}, o.Parents)
	if err != nil {
		return nil, fault(name, apiPath(path.Dir(rel)), err)
	}
	defer unix.Close(dir)
	base := path.Base(rel)
	var st unix.Stat_t
	if err := unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil, fault(name, apiPath(rel), unix.EISDIR)
	}
	mode := uint32(0o644)
	if o.Mode != nil {
		mode = *o.Mode & 0o7777
	}
	tmp := ".bothy-upload." + naming.RandomHex(8)
	fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	done := false
	defer func() {
		if !done {
			unix.Unlinkat(dir, tmp, 0)
		}
	}()
	uid, gid := o.owner()
	_, err = io.Copy(f, body)
	if err == nil {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		err = f.Chmod(os.FileMode(mode & 0o777))
	}
	if err == nil {
		err = unix.Fstat(fd, &st)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	if err := unix.Renameat(dir, tmp, dir, base); err != nil {
		return nil, fault(name, apiPath(rel), err)
	}
	done = true
	e := entryOf(base, apiPath(rel), &st)
	return &e, nil
}

// Remove removes the file at p, or the directory (recursive: with everything in it).
func (s *Store) Remove(name, p string, recursive bool) error {
	r, err := s.openRoot(name)
	if err != nil {
		return err
	}
	defer r.release()
	rel, err := relPath(p)
	if err != nil {
		return err
	}
	dir, base, err := parentOf(name, r.fd, rel)
	if err != nil {
		return err
	}
	parent := os.NewFile(uintptr(dir), apiPath(path.Dir(rel)))
	defer parent.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fault(name, apiPath(rel), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fault(name, apiPath(rel), unix.Unlinkat(dir, base, 0))
	}
	if !recursive {
		return fault(name, apiPath(rel), unix.Unlinkat(dir, base, unix.AT_REMOVEDIR))
	}
	return fault(name, apiPath(rel), platform.RemoveTreeAt(parent, base))
}
