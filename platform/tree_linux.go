//go:build linux

package platform

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DirPathOpen is how many directories of a DirPath are open at most.
const DirPathOpen = 16

// ErrTreeChanged is wrapped by the error of a DirPath that, climbing back up, found a
// directory that is not the one it went down through: the tree was renamed under the walk.
var ErrTreeChanged = errors.New("the directory tree changed during the walk")

// ErrOtherDevice is wrapped by the error of a DirPath refusing to enter a directory on
// another device than the top of its walk (a mount point): a walk that removes or copies a
// tree stays on the tree's file system.
var ErrOtherDevice = errors.New("a mount point in the tree")

// DirPath is a walk's path of directories from a root down to the directory it is in, for
// trees of any depth: it holds at most DirPathOpen descriptors, however deep the walk goes.
// A walk that holds one descriptor per level runs out of descriptors in a tree a few tens of
// thousands deep (what one mkdir loop in a sandbox makes); a walk by path names would follow
// links and renames planted in the tree, and fails past PATH_MAX.
//
// Every directory is entered relative to its parent's descriptor with O_NOFOLLOW, so a link
// is never followed, and never on another device than the walk's first directory. Its
// device and inode are kept. Past DirPathOpen levels the shallowest open descriptor is closed;
// climbing back up to a closed level reopens it as ".." of the level below, which is still
// open, and checks that it is the same directory (device and inode) as on the way down, so
// a rename cannot lead the walk out of the tree: it fails with ErrTreeChanged instead. That
// keeps climbing O(1) per level, where reopening by name from the nearest open ancestor would
// cost O(depth) per reopening.
//
// A DirPath is not safe for concurrent use.
type DirPath struct {
	rootFile *os.File // held so that it stays open (not collected) while the walk uses root
	root     int
	rootName string
	levels   []dirLevel
	open     int // levels whose descriptor is open: always the deepest ones
}

type dirLevel struct {
	name string
	id   FileID
	fd   int // -1 while closed
}

// NewDirPath starts a walk in dir, which stays the caller's: the DirPath neither closes it
// nor changes its offset.
func NewDirPath(dir *os.File) *DirPath {
	return &DirPath{rootFile: dir, root: int(dir.Fd()), rootName: dir.Name()}
}

// Depth is how many directories the walk went down from its root.
func (p *DirPath) Depth() int { return len(p.levels) }

// Fd is the descriptor of the directory the walk is in (the root at depth 0). It is valid
// until the next Push, Pop or Close.
func (p *DirPath) Fd() int {
	if len(p.levels) == 0 {
		return p.root
	}
	return p.levels[len(p.levels)-1].fd
}

// ParentFd is the descriptor of the parent of the directory the walk is in (the root at
// depth 1), reopened if it was closed. It is valid until the next Push, Pop or Close.
func (p *DirPath) ParentFd() (int, error) {
	n := len(p.levels)
	switch n {
	case 0:
		return -1, fmt.Errorf("platform: the walk of %s is at its root, which has no parent here", p.rootName)
	case 1:
		return p.root, nil
	}
	if err := p.reopen(n - 2); err != nil {
		return -1, err
	}
	return p.levels[n-2].fd, nil
}

// Name is the name of the directory the walk is in, in its parent.
func (p *DirPath) Name() string {
	if len(p.levels) == 0 {
		return "."
	}
	return p.levels[len(p.levels)-1].name
}

// Names are the names from the root down to the directory the walk is in.
func (p *DirPath) Names() []string {
	out := make([]string, len(p.levels))
	for i, l := range p.levels {
		out[i] = l.name
	}
	return out
}

// Path names the entry name of the directory the walk is in, for messages: the root's name,
// then the path down, whose middle is elided when the walk is deep.
func (p *DirPath) Path(name string) string {
	const keep = 8
	parts := []string{p.rootName}
	if len(p.levels) > 2*keep {
		for _, l := range p.levels[:keep] {
			parts = append(parts, l.name)
		}
		parts = append(parts, fmt.Sprintf("...(%d more)...", len(p.levels)-2*keep))
		for _, l := range p.levels[len(p.levels)-keep:] {
			parts = append(parts, l.name)
		}
	} else {
		for _, l := range p.levels {
			parts = append(parts, l.name)
		}
	}
	if name != "" {
		parts = append(parts, name)
	}
	return filepath.Join(parts...)
}

// Push enters the directory name of the directory the walk is in. It fails for anything
// but a directory (a link to one included), and for a directory on another device than the
// walk's first one (ErrOtherDevice).
func (p *DirPath) Push(name string) error {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return &os.PathError{Op: "open", Path: p.Path(name), Err: unix.EINVAL}
	}
	fd, err := OpenatRetry(p.Fd(), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p.Path(name), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return &os.PathError{Op: "fstat", Path: p.Path(name), Err: err}
	}
	id := FileID{Dev: uint64(st.Dev), Ino: st.Ino}
	if len(p.levels) > 0 && id.Dev != p.levels[0].id.Dev {
		unix.Close(fd)
		return &os.PathError{Op: "open", Path: p.Path(name), Err: ErrOtherDevice}
	}
	p.levels = append(p.levels, dirLevel{name: name, id: id, fd: fd})
	p.open++
	if p.open > DirPathOpen {
		l := &p.levels[len(p.levels)-p.open]
		unix.Close(l.fd)
		l.fd = -1
		p.open--
	}
	return nil
}

// Pop leaves the directory the walk is in for its parent, reopening the parent if it was
// closed (see DirPath).
func (p *DirPath) Pop() error {
	n := len(p.levels)
	if n == 0 {
		return fmt.Errorf("platform: the walk of %s is at its root already", p.rootName)
	}
	var err error
	if n >= 2 {
		err = p.reopen(n - 2)
	}
	unix.Close(p.levels[n-1].fd)
	p.levels = p.levels[:n-1]
	p.open--
	return err
}

// reopen opens level i, if it is closed, as ".." of level i+1, which must be open, and
// checks it is the directory it was.
func (p *DirPath) reopen(i int) error {
	l := &p.levels[i]
	if l.fd >= 0 {
		return nil
	}
	below := p.levels[i+1].fd
	fd, err := OpenatRetry(below, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p.pathTo(i), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return &os.PathError{Op: "fstat", Path: p.pathTo(i), Err: err}
	}
	if (FileID{Dev: uint64(st.Dev), Ino: st.Ino}) != l.id {
		unix.Close(fd)
		return &os.PathError{Op: "open", Path: p.pathTo(i), Err: ErrTreeChanged}
	}
	l.fd = fd
	p.open++
	return nil
}

func (p *DirPath) pathTo(i int) string {
	q := DirPath{rootName: p.rootName, levels: p.levels[:i+1]}
	return q.Path("")
}

// Close closes every descriptor the walk holds (not its root).
func (p *DirPath) Close() {
	for i := range p.levels {
		if p.levels[i].fd >= 0 {
			unix.Close(p.levels[i].fd)
		}
	}
	p.levels, p.open = nil, 0
}

// ReadNamesFd lists up to n entries (all of them for n <= 0) of the directory open at fd
// through a fresh handle, from its start, without "." and "..".
func ReadNamesFd(fd, n int) ([]string, error) {
	dfd, err := OpenatRetry(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(dfd), ".")
	defer d.Close()
	names, err := d.Readdirnames(n)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return names, err
}

// removeBatch is how many names a tree removal reads at a time.
const removeBatch = 1024

// RemoveTreeAt removes the entry name of dir and, if it is a directory, everything under it,
// as os.RemoveAll would, but for a tree of any depth: it holds at most DirPathOpen
// descriptors (os.RemoveAll holds one per level, and fails with "too many open files" in a
// deep enough tree), never follows a link (it removes the link), and never enters another
// device (a mount point in the tree fails the removal with ErrOtherDevice rather than
// emptying what is mounted). A missing name is not an error. Without root, a directory whose
// mode keeps its owner out is opened up (0700) first, so that a read-only tree can be
// removed. It stops at the first entry it cannot remove.
func RemoveTreeAt(dir *os.File, name string) error { return FS{}.RemoveAllAt(dir, name) }

// RemoveTree removes the entry name of the directory the walk is in as RemoveTreeAt does,
// with a walk of its own (at most DirPathOpen more descriptors), and leaves p where it is.
func (p *DirPath) RemoveTree(name string) error {
	q := &DirPath{root: p.Fd(), rootName: p.Path("")}
	defer q.Close()
	return q.removeTree(FS{}, name)
}

func (p *DirPath) removeTree(f FS, name string) error {
	if done, err := removeOrEnter(f, p, name); done || err != nil {
		return err
	}
	for p.Depth() > 0 {
		names, err := ReadNamesFd(p.Fd(), removeBatch)
		if err != nil {
			return &os.PathError{Op: "readdir", Path: p.Path(""), Err: err}
		}
		if len(names) == 0 {
			base := p.Name()
			if err := p.Pop(); err != nil {
				return err
			}
			if err := f.faultPath(OpRmdir, p.Path(base)); err != nil {
				return err
			}
			if err := unix.Unlinkat(p.Fd(), base, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
				return &os.PathError{Op: "rmdir", Path: p.Path(base), Err: err}
			}
			continue
		}
		// Entries are removed until a directory is entered; the next round lists that one,
		// and this one again (from its start) once the walk is back.
		for _, n := range names {
			done, err := removeOrEnter(f, p, n)
			if err != nil {
				return err
			}
			if !done {
				break
			}
		}
	}
	return nil
}

// removeOrEnter removes the non-directory name of the walk's directory (done), or enters it
// if it is a directory.
func removeOrEnter(f FS, p *DirPath, name string) (done bool, _ error) {
	if err := f.faultPath(OpUnlink, p.Path(name)); err != nil {
		return false, err
	}
	err := unix.Unlinkat(p.Fd(), name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return true, nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return false, &os.PathError{Op: "remove", Path: p.Path(name), Err: err}
	}
	var st unix.Stat_t
	if serr := unix.Fstatat(p.Fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil {
		if errors.Is(serr, unix.ENOENT) {
			return true, nil
		}
		return false, &os.PathError{Op: "lstat", Path: p.Path(name), Err: serr}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false, &os.PathError{Op: "remove", Path: p.Path(name), Err: err}
	}
	// Root needs no mode to read, search and empty a directory. Without root only the
	// owner's bits count; they are set on the directory just checked to be one, relative to
	// its parent's descriptor.
	if st.Mode&0o700 != 0o700 && os.Geteuid() != 0 {
		if err := unix.Fchmodat(p.Fd(), name, 0o700, 0); err != nil {
			return false, &os.PathError{Op: "chmod", Path: p.Path(name), Err: err}
		}
	}
	return false, p.Push(name)
}
