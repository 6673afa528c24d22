package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/naming"
	"github.com/bothy/bothy/platform"
)

// asUser runs fn with the file-system identity of the request's user, so the kernel checks
// every path fn touches against that user's permissions: the agent (root) must not become a
// way for the sandbox's user to read root-only files.
//
// The identity is changed on one OS thread only (setfsuid, setfsgid and an empty group
// list, all per-thread system calls, unlike the process-wide setuid of the Go runtime), in a
// goroutine that stays locked to that thread and exits without unlocking: the Go runtime then
// destroys the thread instead of handing its altered identity to other goroutines. fn must do
// its system calls itself and not hand work to other goroutines. File descriptors it opens
// keep working everywhere: permissions are checked at open.
func (a *agent) asUser(name string, fn func() error) error {
	_, u := a.user(name)
	if a.unprivileged || (u.UID == 0 && u.GID == 0) {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread: see above.
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			done <- fmt.Errorf("dropping groups: %w", e)
			return
		}
		unix.RawSyscall(unix.SYS_SETFSGID, uintptr(u.GID), 0, 0)
		unix.RawSyscall(unix.SYS_SETFSUID, uintptr(u.UID), 0, 0)
		// setfs[ug]id report the previous value, not errors: read back to be sure.
		prevGID, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0)
		prevUID, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0)
		if uint32(prevUID) != u.UID || uint32(prevGID) != u.GID {
			done <- errors.New("switching the file-system identity failed")
			return
		}
		// A non-zero fsuid already clears the file capabilities (DAC override and the
		// like); drop the rest of the effective set too, so that no capability the agent
		// holds can stand in for a permission the user lacks.
		if err := dropEffectiveCaps(); err != nil {
			done <- fmt.Errorf("dropping capabilities: %w", err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// dropEffectiveCaps empties the calling thread's effective capability set (capset is a
// per-thread system call).
func dropEffectiveCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[0].Effective, data[1].Effective = 0, 0
	data[0].Inheritable, data[1].Inheritable = 0, 0
	return unix.Capset(&hdr, &data[0])
}

// openNoMagic opens path relative to dirfd without following /proc's magic links
// (/proc/<pid>/fd/N, /proc/<pid>/root, ...). Through the agent's own entries those would skip
// the search permission of directories the agent has open for someone else.
func openNoMagic(dirfd int, path string, flags int, mode uint32) (int, error) {
	fd, err := unix.Openat2(dirfd, path, &unix.OpenHow{
		Flags:   uint64(flags),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == unix.ENOSYS {
		// Kernels before 5.6: plain openat.
		return unix.Openat(dirfd, path, flags, mode)
	}
	return fd, err
}

// refuseProcForUser keeps the sandbox user from reading the agent's own /proc entries
// (environ, cmdline, ...) through the agent: a process may always inspect itself, and during
// a file operation the agent is the user's proxy. Root inside the sandbox may read /proc.
func (a *agent) refuseProcForUser(user string, fd int, path string) error {
	if name, u := a.user(user); name == control.Root || a.unprivileged || u.UID == 0 {
		return nil
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return err
	}
	if sfs.Type == unix.PROC_SUPER_MAGIC {
		return &control.RemoteError{Code: control.CodePermissionDenied,
			Message: fmt.Sprintf("%q is in /proc, which the file API serves to root only; read it with exec instead.", truncate(path))}
	}
	return nil
}

// fileError turns an operating-system error into what the client is told.
func fileError(err error, path string) error {
	if err == nil {
		return nil
	}
	var re *control.RemoteError
	if errors.As(err, &re) {
		return re
	}
	p := truncate(path)
	mk := func(code, format string) error {
		return &control.RemoteError{Code: code, Message: fmt.Sprintf(format, p)}
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return mk(control.CodeFileNotFound, "%q does not exist inside the sandbox.")
	case errors.Is(err, fs.ErrPermission):
		return mk(control.CodePermissionDenied, "The user may not access %q.")
	case errors.Is(err, syscall.ENOTDIR):
		return mk(control.CodeNotADirectory, "A component of %q is not a directory.")
	case errors.Is(err, syscall.EISDIR):
		return mk(control.CodeIsADirectory, "%q is a directory.")
	case errors.Is(err, syscall.ENOTEMPTY):
		return mk(control.CodeDirectoryNotEmpty, "The directory %q is not empty; remove it with recursive=true to delete it and everything in it.")
	case errors.Is(err, fs.ErrExist):
		return mk(control.CodeFileExists, "%q already exists.")
	case errors.Is(err, syscall.ELOOP):
		return mk(control.CodeSymlinkLoop, "%q has too many levels of symbolic links; a link in it may point back at itself.")
	case errors.Is(err, syscall.ENAMETOOLONG):
		return mk(control.CodeNameTooLong, "A name in %q is longer than the sandbox's file system holds (255 bytes on most); use a shorter one.")
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return mk(control.CodeNoSpace, "No space is left inside the sandbox to write %q.")
	case errors.Is(err, syscall.EROFS):
		return mk(control.CodePermissionDenied, "%q is on a read-only file system.")
	case errors.Is(err, platform.ErrOtherDevice):
		return mk(control.CodeMountInside, "%q has a file system mounted inside it, which a recursive removal does not enter; remove what is mounted there first.")
	case errors.Is(err, platform.ErrTreeChanged):
		return mk(control.CodeFileChanged, "%q was moved while it was removed; remove it again.")
	}
	return err
}

// ReadFile implements control.Handler. Only regular files are read: a FIFO or a device could
// block or never end.
func (a *agent) ReadFile(ctx context.Context, req *control.FileRequest) (io.ReadCloser, int64, error) {
	var f *os.File
	var size int64
	err := a.asUser(req.User, func() error {
		// O_NONBLOCK keeps the open of a FIFO from blocking; it changes nothing for the
		// regular files we go on to read.
		fd, err := openNoMagic(unix.AT_FDCWD, req.Path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: req.Path, Err: err}
		}
		if err := a.refuseProcForUser(req.User, fd, req.Path); err != nil {
			unix.Close(fd)
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
		case unix.S_IFDIR:
			unix.Close(fd)
			return syscall.EISDIR
		default:
			unix.Close(fd)
			return &control.RemoteError{Code: control.CodeNotRegular, Message: fmt.Sprintf("%q is not a regular file.", truncate(req.Path))}
		}
		f = os.NewFile(uintptr(fd), req.Path)
		size = st.Size
		if !sizeIsContent(fd, st.Size) {
			size = control.UnknownSize
		}
		return nil
	})
	if err != nil {
		return nil, 0, fileError(err, req.Path)
	}
	return f, size, nil
}

// sizeIsContent says whether a regular file's size is the length of its content. It is not
// for the kernel's pseudo files: /proc's read as size 0, /sys's as 4096, whatever they hold.
func sizeIsContent(fd int, size int64) bool {
	if size == 0 {
		return false // nothing lost by reading to the end: an empty file ends at once
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return false
	}
	switch fs.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC,
		unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC, unix.SECURITYFS_MAGIC, unix.BPF_FS_MAGIC:
		return false
	}
	return true
}

// WriteFile implements control.Handler: temp file in the target's directory, write, fsync,
// rename over the target, fsync the directory. The target, if it exists, must be a regular
// file. On failure (the client gone included) the temp file is removed. The directory is
// opened once and everything after is relative to it, so the file lands where it was checked.
func (a *agent) WriteFile(ctx context.Context, req *control.FileRequest, r io.Reader) (int64, error) {
	mode := req.Mode
	if mode == 0 {
		mode = 0o644
	}
	dir, base := filepath.Split(req.Path)
	if base == "" {
		return 0, fileError(syscall.EISDIR, req.Path)
	}
	tmp := "." + base + "." + randomHex() + ".tmp"
	dfd, fd := -1, -1
	err := a.asUser(req.User, func() error {
		if req.MakeParents {
			if err := mkdirAll(dir); err != nil {
				return parentError(err, req.Path)
			}
		}
		var err error
		dfd, err = openNoMagic(unix.AT_FDCWD, dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: dir, Err: err}
		}
		if err := a.refuseProcForUser(req.User, dfd, req.Path); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return syscall.EISDIR
			}
			return &control.RemoteError{Code: control.CodeNotRegular,
				Message: fmt.Sprintf("%q exists and is not a regular file; remove it first.", truncate(req.Path))}
		}
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, mode)
		if err != nil {
			return &fs.PathError{Op: "create", Path: req.Path, Err: err}
		}
		// The metadata goes on the new inode before it is renamed into place: the path never
		// shows the new content without it (nor the old file's: a write replaces it).
		if err := writeMetadata(fd, req.Metadata); err != nil {
			unix.Close(fd)
			fd = -1
			unix.Unlinkat(dfd, tmp, 0)
			return err
		}
		// The umask may have narrowed the mode; the request's mode is what we promise.
		if err := unix.Fchmod(fd, mode); err != nil {
			unix.Close(fd)
			fd = -1
			unix.Unlinkat(dfd, tmp, 0)
			return err
		}
		return nil
	})
	if dfd >= 0 {
		defer unix.Close(dfd)
	}
	if err != nil {
		return 0, fileError(err, req.Path)
	}
	f := os.NewFile(uintptr(fd), tmp)
	fail := func(err error) (int64, error) {
		f.Close()
		_ = a.asUser(req.User, func() error { return unix.Unlinkat(dfd, tmp, 0) })
		return 0, err
	}
	n, err := io.Copy(f, r)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fail(&control.RemoteError{Code: control.CodeInvalidRequest, Message: "The upload ended before all of the file arrived; nothing was written."})
		}
		return fail(fileError(err, req.Path))
	}
	if err := f.Sync(); err != nil {
		return fail(fileError(err, req.Path))
	}
	if err := f.Close(); err != nil {
		return fail(fileError(err, req.Path))
	}
	err = a.asUser(req.User, func() error { return unix.Renameat(dfd, tmp, dfd, base) })
	if err != nil {
		_ = a.asUser(req.User, func() error { return unix.Unlinkat(dfd, tmp, 0) })
		return 0, fileError(err, req.Path)
	}
	// A failed directory sync means the rename may not survive a crash: report it.
	if err := unix.Fsync(dfd); err != nil {
		return 0, fileError(err, req.Path)
	}
	return n, nil
}

// randomHex is the random part of the agent's temp names: 16 hex digits.
func randomHex() string { return naming.RandomHex(8) }

// listBatch is how many entries one list frame carries; listDetailsBatch with details, where
// one entry may take about 55 KiB of JSON (4 KiB of metadata and a 4 KiB target, each byte
// of which JSON may spell in 6: "<" is \u003c), so that a frame stays below
// control.MaxFramePayload.
const (
	listBatch        = 256
	listDetailsBatch = 16
)

// List implements control.Handler. The whole listing runs as the user: stat of an entry
// needs search permission on the directory, which is checked at each call. It reads and
// emits listBatch entries at a time, so it holds no more than that whatever the directory's
// size; control.Serve stops it at the request's limit.
func (a *agent) List(ctx context.Context, req *control.FileRequest, emit func([]control.FileInfo) error) error {
	err := a.asUser(req.User, func() error {
		fd, err := openNoMagic(unix.AT_FDCWD, req.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: req.Path, Err: err}
		}
		d := os.NewFile(uintptr(fd), req.Path)
		defer d.Close()
		// Listing refuses what reading refuses: /proc/self/fd would list the agent's own
		// descriptors, /proc/self/task its threads.
		if err := a.refuseProcForUser(req.User, fd, req.Path); err != nil {
			return err
		}
		fi, err := d.Stat()
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return syscall.ENOTDIR
		}
		// With details an entry may carry control.MaxMetadataBytes of metadata and a target
		// of control.MaxPathLen: fewer of them fill a frame.
		n := listBatch
		var names *idNames
		if req.Details {
			n, names = listDetailsBatch, loadIDNames()
		}
		for {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			ents, err := d.ReadDir(n)
			batch := make([]control.FileInfo, 0, len(ents))
			for _, e := range ents {
				info, ierr := e.Info()
				if ierr != nil {
					continue // removed meanwhile
				}
				fi := fileInfo(info)
				if names != nil {
					st, _ := info.Sys().(*syscall.Stat_t)
					names.addDetails(&fi, filepath.Join(req.Path, e.Name()), st)
				}
				batch = append(batch, fi)
			}
			if len(batch) > 0 {
				if eerr := emit(batch); eerr != nil {
					return eerr
				}
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
		}
	})
	return fileError(err, req.Path)
}

// Stat implements control.Handler. It does not follow a final symlink.
func (a *agent) Stat(ctx context.Context, req *control.FileRequest) (control.FileInfo, error) {
	var out control.FileInfo
	err := a.asUser(req.User, func() error {
		fi, err := os.Lstat(req.Path)
		if err != nil {
			return err
		}
		out = fileInfo(fi)
		if req.Details {
			st, _ := fi.Sys().(*syscall.Stat_t)
			loadIDNames().addDetails(&out, req.Path, st)
		}
		return nil
	})
	return out, fileError(err, req.Path)
}

// Mkdir implements control.Handler.
func (a *agent) Mkdir(ctx context.Context, req *control.FileRequest) error {
	mode := fs.FileMode(req.Mode)
	if mode == 0 {
		mode = 0o755
	}
	err := a.asUser(req.User, func() error {
		if req.MakeParents {
			if fi, err := os.Stat(req.Path); err == nil && fi.IsDir() {
				return nil // mkdir -p: an existing directory is left as it is
			}
			if err := mkdirAll(filepath.Dir(req.Path)); err != nil {
				return parentError(err, req.Path)
			}
		}
		if err := os.Mkdir(req.Path, mode); err != nil {
			return err
		}
		// As with files, the request's mode holds whatever the umask.
		return os.Chmod(req.Path, mode)
	})
	return fileError(err, req.Path)
}

// parentMode is the mode of the parent directories that write and mkdir create.
const parentMode = 0o755

// parentError is what the client is told when the missing parents of path could not be made:
// which directory, and why, when the user may not create it (the path alone would say that
// the user may not access a file that does not exist).
func parentError(err error, path string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Op == "mkdir" && errors.Is(err, fs.ErrPermission) {
		return &control.RemoteError{Code: control.CodePermissionDenied,
			Message: fmt.Sprintf("The user may not create the directory %q, which %q needs; write under a directory it may write to, such as /home/user or /tmp.", truncate(pe.Path), truncate(path))}
	}
	return err
}

// mkdirAll is os.MkdirAll with parentMode set exactly on every directory it creates: the
// process's umask is not the agent's to rely on (an exec may have set it for its fork; see
// startWithUmask).
func mkdirAll(path string) error {
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil
		}
		return &fs.PathError{Op: "mkdir", Path: path, Err: syscall.ENOTDIR}
	}
	if parent := filepath.Dir(path); parent != path {
		if err := mkdirAll(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(path, parentMode); err != nil {
		if fi, serr := os.Lstat(path); serr == nil && fi.IsDir() {
			return nil // made meanwhile
		}
		return err
	}
	return os.Chmod(path, parentMode)
}

// Remove implements control.Handler. A missing path is file-not-found, also when recursive.
func (a *agent) Remove(ctx context.Context, req *control.FileRequest) error {
	if filepath.Clean(req.Path) == "/" {
		return &control.RemoteError{Code: control.CodeInvalidRequest, Message: "The root directory cannot be removed."}
	}
	err := a.asUser(req.User, func() error {
		if _, err := os.Lstat(req.Path); err != nil {
			return err
		}
		if req.Recursive {
			return removeTree(req.Path)
		}
		return os.Remove(req.Path)
	})
	return fileError(err, req.Path)
}

// removeTree removes path and everything under it with platform.RemoveTreeAt, which holds a
// bounded number of descriptors however deep the tree (os.RemoveAll holds one per level and
// fails with "too many open files" in a tree a mkdir loop makes 22 000 deep). The parent is
// opened with O_PATH: like unlink, removing needs search permission on it, not read.
func removeTree(path string) error {
	dir, base := filepath.Split(filepath.Clean(path))
	fd, err := openNoMagic(unix.AT_FDCWD, dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	parent := os.NewFile(uintptr(fd), dir)
	defer parent.Close()
	return platform.RemoveTreeAt(parent, base)
}

func fileInfo(fi fs.FileInfo) control.FileInfo {
	t := control.TypeOther
	switch m := fi.Mode(); {
	case m.IsRegular():
		t = control.TypeFile
	case m.IsDir():
		t = control.TypeDir
	case m&fs.ModeSymlink != 0:
		t = control.TypeSymlink
	}
	mode := uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return control.FileInfo{Name: fi.Name(), Type: t, Size: fi.Size(), Mode: mode, ModifiedAt: fi.ModTime().UTC()}
}
