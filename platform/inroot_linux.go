//go:build linux

package platform

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// inRoot is how every *InRoot function resolves a path: as if root were "/" (an absolute
// link, or "..", never leaves it), with no /proc magic link (which could name any file).
const inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// OpenInRoot opens path below the directory root as if root were the file system's root:
// every component, symbolic links included, is resolved inside root (openat2 with
// RESOLVE_IN_ROOT), so whatever links a directory tree holds, the file opened lies in it.
// flags are open(2) flags; O_CLOEXEC is added.
func OpenInRoot(root *os.File, p string, flags int) (*os.File, error) {
	rel, err := relInRoot(p)
	if err != nil {
		return nil, err
	}
	var nfd int
	err = control(root, func(fd int) error {
		// EAGAIN: a rename elsewhere in the tree raced the lookup, which the kernel then
		// refuses to vouch for; a few more tries, not forever.
		for try := 0; ; try++ {
			var err error
			nfd, err = unix.Openat2(fd, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: inRoot})
			if err != unix.EINTR && (err != unix.EAGAIN || try == 16) {
				return err
			}
		}
	})
	if err != nil {
		return nil, &os.PathError{Op: "open in root", Path: filepath.Join(root.Name(), rel), Err: err}
	}
	return os.NewFile(uintptr(nfd), filepath.Join(root.Name(), rel)), nil
}

// relInRoot cleans p into a path relative to a root ("." for the root itself).
func relInRoot(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", &os.PathError{Op: "open in root", Path: p, Err: errors.New("path holds a NUL byte")}
	}
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

// MkdirAllInRoot makes the directory path below root and every missing parent with perm (as
// mkdir(2): subject to the umask), each resolved as [OpenInRoot] does, and returns an O_PATH
// handle of it: a mount target that no link swapped in later can redirect. A component that
// is a link is followed inside root; one that is not a directory, or a link to nothing, is an
// error.
func MkdirAllInRoot(root *os.File, p string, perm fs.FileMode) (*os.File, error) {
	rel, err := relInRoot(p)
	if err != nil {
		return nil, err
	}
	const dirFlags = unix.O_PATH | unix.O_DIRECTORY
	cur, err := OpenInRoot(root, ".", dirFlags)
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return cur, nil
	}
	prefix := ""
	for _, name := range strings.Split(rel, "/") {
		prefix = path.Join(prefix, name)
		next, err := OpenInRoot(root, prefix, dirFlags)
		if errors.Is(err, fs.ErrNotExist) {
			// Made in the directory just resolved, by a plain name: mkdir never follows a
			// final link, and the directory is then opened through the root again.
			merr := control(cur, func(fd int) error {
				return IgnoringEINTR(func() error { return unix.Mkdirat(fd, name, uint32(perm.Perm())) })
			})
			if merr != nil && !errors.Is(merr, unix.EEXIST) {
				cur.Close()
				return nil, &os.PathError{Op: "mkdir in root", Path: filepath.Join(root.Name(), prefix), Err: merr}
			}
			next, err = OpenInRoot(root, prefix, dirFlags)
		}
		cur.Close()
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

// MakeFileInRoot makes an empty regular file at path below root, unless one is there, with
// its missing parents (see [MkdirAllInRoot]), and returns an O_PATH handle of it: a mount
// target for a file. The final component is never a link, followed or made.
func MakeFileInRoot(root *os.File, p string, perm fs.FileMode) (*os.File, error) {
	parent, name, err := parentInRoot(root, p)
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	var nfd int
	err = control(parent, func(fd int) error {
		f, err := OpenatRetry(fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err != nil {
			return err
		}
		unix.Close(f)
		nfd, err = OpenatRetry(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return err
	})
	full := filepath.Join(parent.Name(), name)
	if err != nil {
		return nil, &os.PathError{Op: "create in root", Path: full, Err: err}
	}
	f := os.NewFile(uintptr(nfd), full)
	if st, err := StatOf(f); err != nil || !st.IsRegular() {
		f.Close()
		return nil, &os.PathError{Op: "create in root", Path: full, Err: ErrNotRegular}
	}
	return f, nil
}

// SymlinkInRoot makes the symbolic link path below root, pointing to target (which is not
// resolved now), with its missing parents (see [MkdirAllInRoot]).
func SymlinkInRoot(root *os.File, p, target string) error {
	parent, name, err := parentInRoot(root, p)
	if err != nil {
		return err
	}
	defer parent.Close()
	err = control(parent, func(fd int) error {
		return IgnoringEINTR(func() error { return unix.Symlinkat(target, fd, name) })
	})
	if err != nil {
		return &os.PathError{Op: "symlink in root", Path: filepath.Join(parent.Name(), name), Err: err}
	}
	return nil
}

// parentInRoot makes and opens the parent directory of p below root, and returns it with
// p's last component.
func parentInRoot(root *os.File, p string) (*os.File, string, error) {
	rel, err := relInRoot(p)
	if err != nil {
		return nil, "", err
	}
	if rel == "." {
		return nil, "", &os.PathError{Op: "open in root", Path: p, Err: fmt.Errorf("the root itself has no name")}
	}
	parent, err := MkdirAllInRoot(root, path.Dir(rel), 0o755)
	if err != nil {
		return nil, "", err
	}
	return parent, path.Base(rel), nil
}
