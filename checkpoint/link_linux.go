//go:build linux

package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// LinkLayer makes dst a tree of the layer src's directories (with their modes, owners,
// times and xattrs, overlayfs's opaque marks among them) whose other entries (files,
// links, whiteouts) are hard links to src's. src must be a frozen layer that nothing writes.
func LinkLayer(src, dst string) error {
	// Both trees are reached through one os.Root at their common ancestor, so that no link
	// in a layer (a sandbox's own files) can lead a walk, a mkdir or a link out of it.
	base := commonDir(src, dst)
	root, err := os.OpenRoot(base)
	if err != nil {
		return err
	}
	defer root.Close()
	rsrc, err := filepath.Rel(base, src)
	if err != nil {
		return err
	}
	rdst, err := filepath.Rel(base, dst)
	if err != nil {
		return err
	}
	var dirs []string
	err = fs.WalkDir(root.FS(), rsrc, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(rsrc, p)
		if err != nil {
			return err
		}
		to := filepath.Join(rdst, rel)
		if d.IsDir() {
			dirs = append(dirs, rel)
			return root.Mkdir(to, 0o700)
		}
		return root.Link(p, to)
	})
	if err != nil {
		return fmt.Errorf("linking layer %s: %w", src, err)
	}
	// Directories get their metadata deepest first, so that setting a parent's times is
	// not undone by making its children.
	slices.Reverse(dirs)
	for _, rel := range dirs {
		if err := copyDirMeta(filepath.Join(src, rel), filepath.Join(dst, rel)); err != nil {
			return fmt.Errorf("linking layer %s: %w", src, err)
		}
	}
	return nil
}

// commonDir is the deepest directory that holds both a and b (absolute, clean paths).
func commonDir(a, b string) string {
	d := filepath.Dir(a)
	for d != "/" && !strings.HasPrefix(b, d+"/") {
		d = filepath.Dir(d)
	}
	return d
}

func copyDirMeta(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return &os.PathError{Op: "chown", Path: dst, Err: err}
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return nil
}

func copyXattrs(src, dst string) error {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(src, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "listxattr", Path: src, Err: err}
	}
	val := make([]byte, 64<<10)
	for _, name := range splitNames(buf[:n]) {
		v, err := unix.Lgetxattr(src, name, val)
		if err != nil {
			return &os.PathError{Op: "getxattr " + name, Path: src, Err: err}
		}
		if err := unix.Lsetxattr(dst, name, val[:v], 0); err != nil {
			return &os.PathError{Op: "setxattr " + name, Path: dst, Err: err}
		}
	}
	return nil
}

func splitNames(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := slices.Index(b, 0)
		if i < 0 {
			i = len(b)
		}
		if i > 0 {
			out = append(out, string(b[:i]))
		}
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	return out
}
