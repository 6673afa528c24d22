//go:build linux

package platform

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// control runs fn with f's descriptor without taking it out of the runtime's hands (unlike
// f.Fd, which would switch it to blocking mode and disable deadlines).
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// checkName refuses anything but one plain directory entry name, so that the *At functions
// never resolve a path through other directories or links.
func checkName(op, name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || strings.ContainsRune(name, 0) {
		return &os.PathError{Op: op, Path: name, Err: fmt.Errorf("not a plain file name")}
	}
	return nil
}

func statFromUnix(st *unix.Stat_t) Stat {
	return Stat{
		ID:    FileID{Dev: uint64(st.Dev), Ino: uint64(st.Ino)},
		Mode:  modeFromUnix(uint32(st.Mode)),
		UID:   st.Uid,
		Nlink: uint64(st.Nlink),
		Size:  st.Size,
	}
}

func modeFromUnix(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// StatOf returns the status of an open file.
func StatOf(f *os.File) (Stat, error) {
	var st unix.Stat_t
	err := control(f, func(fd int) error {
		return IgnoringEINTR(func() error { return unix.Fstat(fd, &st) })
	})
	if err != nil {
		return Stat{}, &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	return statFromUnix(&st), nil
}

// IDOf returns the identity of an open file.
func IDOf(f *os.File) (FileID, error) {
	st, err := StatOf(f)
	return st.ID, err
}

// LstatAt returns the status of the entry name in dir without following it if it is a link.
// A missing entry gives an error that matches fs.ErrNotExist.
func LstatAt(dir *os.File, name string) (Stat, error) {
	if err := checkName("lstat", name); err != nil {
		return Stat{}, err
	}
	var st unix.Stat_t
	err := control(dir, func(fd int) error {
		return IgnoringEINTR(func() error { return unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
	})
	if err != nil {
		return Stat{}, &os.PathError{Op: "lstat", Path: filepath.Join(dir.Name(), name), Err: err}
	}
	return statFromUnix(&st), nil
}

// OpenDir opens the directory at path for use as a directory handle. A final component that
// is a symbolic link is refused, not followed.
func OpenDir(path string) (*os.File, error) {
	fd, err := OpenatRetry(unix.AT_FDCWD, path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// OpenDirAt opens the directory entry name in dir as a directory handle, refusing a link.
func OpenDirAt(dir *os.File, name string) (*os.File, error) {
	if name != "." {
		if err := checkName("open", name); err != nil {
			return nil, err
		}
	}
	path := filepath.Join(dir.Name(), name)
	var nfd int
	err := control(dir, func(fd int) error {
		var err error
		nfd, err = OpenatRetry(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(nfd), path), nil
}

// MkdirAt creates the directory name in dir with perm (subject to the umask, as mkdir(2)).
// An existing entry gives an error that matches fs.ErrExist.
func MkdirAt(dir *os.File, name string, perm fs.FileMode) error {
	if err := checkName("mkdir", name); err != nil {
		return err
	}
	err := control(dir, func(fd int) error {
		return IgnoringEINTR(func() error { return unix.Mkdirat(fd, name, uint32(perm.Perm())) })
	})
	if err != nil {
		return &os.PathError{Op: "mkdir", Path: filepath.Join(dir.Name(), name), Err: err}
	}
	return nil
}

// OpenFileAt opens the regular file name in dir. It adds O_NOFOLLOW, O_NONBLOCK and O_CLOEXEC
// to flag, so that a link is refused rather than followed and a FIFO or device never blocks the
// open, and then refuses anything that fstat does not report as a regular file. Every refusal
// wraps ErrNotRegular and leaves the entry as it was. With os.O_CREATE a missing file is
// created with perm (subject to the umask).
func OpenFileAt(dir *os.File, name string, flag int, perm fs.FileMode) (*os.File, error) {
	if err := checkName("open", name); err != nil {
		return nil, err
	}
	path := filepath.Join(dir.Name(), name)
	var nfd int
	err := control(dir, func(fd int) error {
		var err error
		nfd, err = OpenatRetry(fd, name, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
		return err
	})
	return finishRegularOpen(nfd, path, err)
}

// OpenFile is OpenFileAt for a path; only its final component is protected against links.
func OpenFile(path string, flag int, perm fs.FileMode) (*os.File, error) {
	fd, err := OpenatRetry(unix.AT_FDCWD, path, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
	return finishRegularOpen(fd, path, err)
}

func finishRegularOpen(fd int, path string, err error) (*os.File, error) {
	if err != nil {
		switch err {
		case unix.ELOOP:
			return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: it is a symbolic link", ErrNotRegular)}
		case unix.EISDIR:
			return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: it is a directory", ErrNotRegular)}
		case unix.ENXIO:
			// Opening a FIFO for writing without a reader, or a socket, fails so.
			return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: it is a FIFO, socket or device", ErrNotRegular)}
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := IgnoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("%w: its type is %v", ErrNotRegular, modeFromUnix(uint32(st.Mode)).Type())}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// ReadFileAt reads the regular file name in dir, opened as OpenFileAt does (never following a
// link, never blocking on a FIFO), and refuses a file larger than max bytes with ErrTooLarge.
func ReadFileAt(dir *os.File, name string, max int64) ([]byte, error) {
	f, err := OpenFileAt(dir, name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, max)
}

// ReadFile is ReadFileAt for a path; only its final component is protected against links.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, max)
}

func readBounded(f *os.File, max int64) ([]byte, error) {
	// Read one byte past the bound, so that a file that grew after fstat is caught as well.
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, &os.PathError{Op: "read", Path: f.Name(), Err: fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)}
	}
	return data, nil
}

// ListDir lists the entries of the directory at path (without "." and ".."), sorted. A final
// component that is a symbolic link is refused, not followed; a missing directory is an error
// wrapping fs.ErrNotExist.
func ListDir(path string) ([]string, error) {
	d, err := OpenDir(path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// ReadDirNames lists the entries of dir (without "." and ".."), reading from its start however
// often it is called: it lists a fresh handle on the same directory, not dir's own offset.
func ReadDirNames(dir *os.File) ([]string, error) {
	d, err := OpenDirAt(dir, ".")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

// UnlinkAt removes the non-directory entry name from dir. A link is removed, never followed.
func UnlinkAt(dir *os.File, name string) error {
	return unlinkAt(dir, name, 0)
}

// RmdirAt removes the empty directory name from dir.
func RmdirAt(dir *os.File, name string) error {
	return unlinkAt(dir, name, unix.AT_REMOVEDIR)
}

func unlinkAt(dir *os.File, name string, flags int) error {
	if err := checkName("remove", name); err != nil {
		return err
	}
	err := control(dir, func(fd int) error {
		return IgnoringEINTR(func() error { return unix.Unlinkat(fd, name, flags) })
	})
	if err != nil {
		return &os.PathError{Op: "remove", Path: filepath.Join(dir.Name(), name), Err: err}
	}
	return nil
}

// SyncDir flushes a directory's entries to stable storage, so that creations, renames and
// removals in it survive a crash. Its error must be reported: a rename is not durable without it.
func SyncDir(dir *os.File) error {
	err := control(dir, func(fd int) error {
		return IgnoringEINTR(func() error { return unix.Fsync(fd) })
	})
	if err != nil {
		return &os.PathError{Op: "fsync", Path: dir.Name(), Err: err}
	}
	return nil
}

// SyncDirPath is SyncDir for the directory at path.
func SyncDirPath(path string) error {
	d, err := OpenDir(path)
	if err != nil {
		return err
	}
	defer d.Close()
	return SyncDir(d)
}

// OpenatRetry is openat(2), retried while a signal interrupts it.
func OpenatRetry(dirfd int, name string, flag int, perm uint32) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flag, perm)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// IgnoringEINTR runs fn, again while it fails with EINTR: a system call that a signal
// interrupted is retried rather than reported.
func IgnoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// GrowPipe asks for a pipe's capacity to be size bytes, so that a reader takes up to that much
// per read. It is only an optimisation: the kernel refuses it past fs.pipe-max-size or once
// the user holds many pipe pages, and the pipe then keeps its size.
func GrowPipe(f *os.File, size int) {
	if sc, err := f.SyscallConn(); err == nil {
		_ = sc.Control(func(fd uintptr) {
			_, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size) // refused: the size it had
		})
	}
}

// SetCloseOnExec sets or clears f's close-on-exec flag: a descriptor without it stays open in
// the program an exec starts.
func SetCloseOnExec(f *os.File, on bool) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	flags := 0
	if on {
		flags = unix.FD_CLOEXEC
	}
	var ferr error
	if cerr := sc.Control(func(fd uintptr) { _, ferr = unix.FcntlInt(fd, unix.F_SETFD, flags) }); cerr != nil {
		return cerr
	}
	return ferr
}
