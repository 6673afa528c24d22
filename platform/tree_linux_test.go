//go:build linux

package platform

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// DeepTreeDepth is how deep the deep-tree tests go: deeper than a default descriptor limit
// allows a walk with one descriptor per level to go, as one mkdir loop in a sandbox makes.
const deepTreeDepth = 22000

// makeDeepTree makes a chain of depth directories named "d" under dir/name, with a file at
// every 1000th level, and returns how many files it made. It holds two descriptors at a time.
func makeDeepTree(t testing.TB, dir, name string, depth int) int {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(filepath.Join(dir, name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for i := range depth {
		if i%1000 == 0 {
			f, err := unix.Openat(fd, "f", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(f)
			files++
		}
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		fd = next
	}
	unix.Close(fd)
	return files
}

// lowDescriptorLimit lowers the soft descriptor limit for the rest of the test, so that a
// walk holding one descriptor per level fails however high the machine's limit is.
func lowDescriptorLimit(t *testing.T, n uint64) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = min(n, old.Max)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &old) })
}

// TestRemoveTreeDeep removes a tree 22 000 levels deep under a limit of 1024 descriptors.
// os.RemoveAll, which it replaces, fails there with "too many open files". Not parallel: the
// descriptor limit is the process's.
func TestRemoveTreeDeep(t *testing.T) {
	dir := t.TempDir()
	makeDeepTree(t, dir, "deep", deepTreeDepth)
	// A link in the tree to a directory outside it: removed, not followed.
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "precious"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "deep", "d", "link")); err != nil {
		t.Fatal(err)
	}
	// A directory that keeps its owner out: opened up first without root.
	if err := os.Mkdir(filepath.Join(dir, "deep", "d", "locked"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "deep", "d", "locked", "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "deep", "d", "locked"), 0o500); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	lowDescriptorLimit(t, 1024)
	if err := RemoveTreeAt(d, "deep"); err != nil {
		t.Fatalf("removing a tree %d deep: %.300v", deepTreeDepth, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "deep")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the tree is still there: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "precious")); err != nil || string(b) != "keep" {
		t.Fatalf("the link's target was touched: %q %v", b, err)
	}
	// A missing name, and a file, are fine too.
	if err := RemoveTreeAt(d, "deep"); err != nil {
		t.Fatalf("removing a missing tree: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTreeAt(d, "file"); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTreeAt(d, "link-to-nothing"); err != nil {
		t.Fatal(err)
	}
}

// TestRemoveTreeStaysOnItsDevice: a mount point in the tree stops the removal; what is
// mounted there is not emptied.
func TestRemoveTreeStaysOnItsDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	t.Parallel()
	dir := t.TempDir()
	mnt := filepath.Join(dir, "tree", "a", "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mnt, "mounted"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := RemoveTreeAt(d, "tree"); !errors.Is(err, ErrOtherDevice) {
		t.Fatalf("removing a tree with a mount point in it: %v, want ErrOtherDevice", err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "mounted")); err != nil || string(b) != "keep" {
		t.Fatalf("the mount's content was touched: %q %v", b, err)
	}
}

// TestDirPathNoticesRename: climbing back to a level whose descriptor was closed, a walk
// whose directory was moved under another parent fails instead of following it out.
func TestDirPathNoticesRename(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const depth = DirPathOpen + 4
	names := make([]string, depth)
	for i := range names {
		names[i] = "d" + string(rune('a'+i))
	}
	if err := os.MkdirAll(filepath.Join(append([]string{dir}, names...)...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "elsewhere"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := NewDirPath(d)
	defer p.Close()
	for _, n := range names {
		if err := p.Push(n); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(p.Names(), "/"); got != strings.Join(names, "/") {
		t.Fatalf("names %q", got)
	}
	// Levels 0 to 3 are closed now. Move level 4 (open) under another parent.
	from := filepath.Join(append([]string{dir}, names[:5]...)...)
	if err := os.Rename(from, filepath.Join(dir, "elsewhere", names[4])); err != nil {
		t.Fatal(err)
	}
	var popErr error
	for p.Depth() > 0 && popErr == nil {
		popErr = p.Pop()
	}
	if !errors.Is(popErr, ErrTreeChanged) {
		t.Fatalf("climbing out of a moved directory: %v, want ErrTreeChanged", popErr)
	}
	if p.Depth() != 4 {
		t.Fatalf("the walk stopped at depth %d, want 4 (at the moved directory's old parent)", p.Depth())
	}
}

// TestDirPathRefusesLinks: a walk enters directories only, never through a link.
func TestDirPathRefusesLinks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := NewDirPath(d)
	defer p.Close()
	for _, name := range []string{"link", "..", ".", "a/b", ""} {
		if err := p.Push(name); err == nil {
			t.Errorf("the walk entered %q", name)
		}
	}
}
