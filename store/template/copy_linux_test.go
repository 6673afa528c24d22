//go:build linux

package template

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
)

const deepLayerDepth = 22000

// makeDeepLayer makes a chain of depth directories named "d" in dir, with a file named file
// at every 1000th level, and at the bottom two hard links to one file (whose path from the
// top is far beyond PATH_MAX). It holds two descriptors at a time.
func makeDeepLayer(t testing.TB, dir string, depth int, file string) {
	t.Helper()
	// Before t.TempDir's own cleanup, whose os.RemoveAll needs a descriptor per level.
	t.Cleanup(func() {
		if d, err := os.Open(dir); err == nil {
			platform.RemoveTreeAt(d, "d")
			d.Close()
		}
	})
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range depth {
		if i%1000 == 0 {
			f, err := unix.Openat(fd, file, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Write(f, []byte(file))
			unix.Close(f)
		}
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil && err != unix.EEXIST {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		fd = next
	}
	f, err := unix.Openat(fd, file+"-1", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(f)
	if err := unix.Linkat(fd, file+"-1", fd, file+"-2", 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
}

// deepLayerShape walks the chain of "d" directories under dir and reports its depth, how
// many of its levels hold each of names, and whether the bottom's two hard links share an
// inode.
func deepLayerShape(t testing.TB, dir string, names ...string) (depth int, counts map[string]int, linked bool) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	counts = map[string]int{}
	for {
		var st unix.Stat_t
		for _, n := range names {
			if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				counts[n]++
			}
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			var a, b unix.Stat_t
			if unix.Fstatat(fd, "lower-1", &a, 0) == nil && unix.Fstatat(fd, "lower-2", &b, 0) == nil {
				linked = a.Ino == b.Ino
			}
			unix.Close(fd)
			return depth, counts, linked
		}
		unix.Close(fd)
		fd = next
		depth++
	}
}

// TestCaptureDeepLayers captures, under a limit of 1024 descriptors, a layer 22 000
// directories deep and then merges another as deep over it, and retires the generation. The
// recursive copy this replaced held two descriptors per level (source and copy) and failed
// with "too many open files" some 500 levels down. Not parallel: the descriptor limit is the
// process's.
func TestCaptureDeepLayers(t *testing.T) {
	lower, upper := t.TempDir(), t.TempDir()
	makeDeepLayer(t, lower, deepLayerDepth, "lower")
	makeDeepLayer(t, upper, deepLayerDepth, "upper")
	e := newEnv(t)
	if _, err := e.s.CreateTemplate(ctxT(t), "deep"); err != nil {
		t.Fatal(err)
	}
	var layers []*os.File
	for _, dir := range []string{lower, upper} {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		layers = append(layers, f)
	}

	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = min(1024, old.Max)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &old)

	g, err := e.s.CaptureLayers(ctxT(t), "deep", layers, testKey, nil)
	if err != nil {
		t.Fatalf("capturing layers %d deep: %.300v", deepLayerDepth, err)
	}
	payload, _ := e.s.PayloadDir("deep", g.ID)
	depth, counts, linked := deepLayerShape(t, payload, "lower", "upper")
	if depth != deepLayerDepth || counts["lower"] != deepLayerDepth/1000 || counts["upper"] != deepLayerDepth/1000 || !linked {
		t.Fatalf("the copy is %d deep with %v files, hard links kept %v; want %d deep, %d of each, kept",
			depth, counts, linked, deepLayerDepth, deepLayerDepth/1000)
	}
	if out, err := e.s.Retire(ctxT(t), "deep", g.ID, false, nil); err != nil || out != Retired {
		t.Fatalf("retiring the deep generation: %v %.300v", out, err)
	}
	if _, err := os.Lstat(filepath.Join(payload, "d")); !os.IsNotExist(err) {
		t.Fatalf("the deep copy is still there after retirement: %v", err)
	}
}
