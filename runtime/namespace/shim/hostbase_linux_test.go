//go:build linux

package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHostBaseShared: concurrent starts make the shared base layer once, under one name,
// leaving no temporary directory; other host content makes another name.
func TestHostBaseShared(t *testing.T) {
	needRoot(t) // the layer's home/user belongs to the workload user
	parent := filepath.Join(t.TempDir(), "host")
	h, err := readHostBase()
	if err != nil {
		t.Fatal(err)
	}
	// A crashed build's leftover goes with the next build; a fresh one may be another's.
	if err := os.MkdirAll(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(parent, ".host-x.0123456789abcdef.tmp")
	fresh := filepath.Join(parent, ".host-y.0123456789abcdef.tmp")
	for _, p := range []string{stale, fresh} {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(stale, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	dirs := make([]string, 4)
	errs := make([]error, 4)
	for i := range dirs {
		wg.Go(func() { dirs[i], errs[i] = h.ensure(parent) })
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != dirs[0] {
			t.Fatalf("start %d: %q %v; want %q", i, dirs[i], errs[i], dirs[0])
		}
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("a crashed build's leftover is still there: %v", err)
	}
	if err := os.Remove(fresh); err != nil {
		t.Fatalf("a fresh build's directory went: %v", err)
	}
	ents, err := os.ReadDir(parent)
	if err != nil || len(ents) != 1 || ents[0].Name() != h.name() {
		t.Fatalf("the parent holds %v (%v); want the layer alone", ents, err)
	}
	if fi, err := os.Stat(filepath.Join(dirs[0], "etc", "passwd")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("etc/passwd: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(dirs[0], "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("tmp: %v %v", fi, err)
	}

	other := *h
	other.files = map[string][]byte{"os-release": []byte("ID=other\n")}
	if other.name() == h.name() {
		t.Fatal("other host content has the same layer name")
	}

}

// TestHostFilesLayer: a sandbox's own /etc/hostname and /etc/hosts are made on a tmpfs of
// their own, with the modes a base layer's files have, and nothing on the state directory's
// disk.
func TestHostFilesLayer(t *testing.T) {
	needRoot(t)
	m, err := hostFilesLayer("box", -1)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(m.Fd()), &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("the layer's file system is %#x (%v), not a tmpfs", fs.Type, err)
	}
	root := fmt.Sprintf("/proc/self/fd/%d", m.Fd())
	for name, want := range map[string]string{
		"hostname": "box\n",
		"hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tbox\n",
	} {
		p := filepath.Join(root, "etc", name)
		b, err := os.ReadFile(p)
		if err != nil || string(b) != want {
			t.Fatalf("%s %q %v", name, b, err)
		}
		if fi, err := os.Lstat(p); err != nil || fi.Mode() != 0o644 {
			t.Fatalf("%s: %v %v", name, fi.Mode(), err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(root, "etc")); err != nil || fi.Mode() != os.ModeDir|0o755 {
		t.Fatalf("etc: %v %v", fi, err)
	}
}

func needRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("the host base layer's files are owned by root and user; CI runs these tests as root")
	}
}
