package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bothy/bothy/control"
	"github.com/bothy/bothy/errcode"
)

func TestFilesRoundTrip(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	dir := userDir(t)
	path := filepath.Join(dir, "sub", "deep", "big.bin")

	// 32 MiB streamed in and out, hashed on both ends rather than held.
	const size = 32 << 20
	want := sha256.New()
	n, err := c.WriteFile(ctx, control.WriteRequest{Path: path, Mode: 0o640, MakeParents: true},
		io.TeeReader(io.LimitReader(rand.Reader, size), want))
	if err != nil || n != size {
		t.Fatalf("write: %d %v", n, err)
	}
	rc, _, err := c.ReadFile(ctx, path, "")
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	if m, err := io.Copy(got, rc); err != nil || m != size {
		t.Fatalf("read: %d %v", m, err)
	}
	rc.Close()
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("read back differs")
	}

	fi, err := c.Stat(ctx, path, "")
	if err != nil || fi.Type != control.TypeFile || fi.Size != size || fi.Mode != 0o640 || fi.Name != "big.bin" {
		t.Fatalf("stat: %+v %v", fi, err)
	}

	// Overwrite: the content is replaced whole, no temp files remain.
	if _, err := c.WriteFile(ctx, control.WriteRequest{Path: path}, bytes.NewReader([]byte("small"))); err != nil {
		t.Fatal(err)
	}
	rc, _, err = c.ReadFile(ctx, path, "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "small" {
		t.Fatalf("after overwrite: %q", b)
	}
	// An empty file reads as empty.
	if _, err := c.WriteFile(ctx, control.WriteRequest{Path: filepath.Join(dir, "empty")}, bytes.NewReader(nil)); err != nil {
		t.Fatal(err)
	}
	rc, _, err = c.ReadFile(ctx, filepath.Join(dir, "empty"), "")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(rc); err != nil || len(b) != 0 {
		t.Fatalf("empty: %q %v", b, err)
	}
	rc.Close()

	if err := c.Mkdir(ctx, filepath.Join(dir, "made"), "", 0o700, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Mkdir(ctx, filepath.Join(dir, "made"), "", 0, false); !errors.Is(err, errcode.FileExists) {
		t.Fatalf("mkdir existing: %v", err)
	}
	if err := c.Mkdir(ctx, filepath.Join(dir, "made"), "", 0, true); err != nil {
		t.Fatalf("mkdir -p existing: %v", err)
	}
	os.Symlink("sub", filepath.Join(dir, "link"))

	list, err := c.List(ctx, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]control.FileType{}
	for _, e := range list {
		types[e.Name] = e.Type
	}
	wantTypes := map[string]control.FileType{"sub": control.TypeDir, "empty": control.TypeFile, "made": control.TypeDir, "link": control.TypeSymlink}
	if len(types) != len(wantTypes) {
		t.Fatalf("list: %+v (temp files left?)", list)
	}
	for k, v := range wantTypes {
		if types[k] != v {
			t.Fatalf("list: %s is %q, want %q (%+v)", k, types[k], v, list)
		}
	}
	if fi, err := c.Stat(ctx, filepath.Join(dir, "made"), ""); err != nil || fi.Mode != 0o700 || fi.Type != control.TypeDir {
		t.Fatalf("stat made: %+v %v", fi, err)
	}

	if err := c.Remove(ctx, filepath.Join(dir, "sub"), "", false); err == nil {
		t.Fatal("removing a non-empty directory without recursive worked")
	} else if re := new(control.RemoteError); !errors.As(err, &re) || re.Code != control.CodeDirectoryNotEmpty {
		t.Fatalf("remove non-empty: %v", err)
	}
	if err := c.Remove(ctx, filepath.Join(dir, "sub"), "", true); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, filepath.Join(dir, "empty"), "", false); err != nil {
		t.Fatal(err)
	}
	list, _ = c.List(ctx, dir, "")
	names := []string{}
	for _, e := range list {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"link", "made"}) {
		t.Fatalf("after remove: %v", names)
	}
}

func TestFilesErrors(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	dir := worldDir(t)
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.Symlink("loop", filepath.Join(dir, "loop"))
	// A directory the user may remove entries of (0777, not sticky), holding one not empty.
	os.MkdirAll(filepath.Join(dir, "open", "full", "in"), 0o755)
	os.Chmod(filepath.Join(dir, "open"), 0o777)
	missing := filepath.Join(dir, "missing")

	read := func(p string) error {
		rc, _, err := c.ReadFile(ctx, p, "")
		if err == nil {
			rc.Close()
		}
		return err
	}
	write := func(p string) error {
		_, err := c.WriteFile(ctx, control.WriteRequest{Path: p}, bytes.NewReader([]byte("data")))
		return err
	}
	list := func(p string) error { _, err := c.List(ctx, p, ""); return err }
	stat := func(p string) error { _, err := c.Stat(ctx, p, ""); return err }
	cases := []struct {
		name   string
		op     func() error
		remote string
		code   errcode.Code
	}{
		{"read missing", func() error { return read(missing) }, control.CodeFileNotFound, errcode.FileNotFound},
		{"stat missing", func() error { return stat(missing) }, control.CodeFileNotFound, errcode.FileNotFound},
		{"list missing", func() error { return list(missing) }, control.CodeFileNotFound, errcode.FileNotFound},
		{"remove missing", func() error { return c.Remove(ctx, missing, "", true) }, control.CodeFileNotFound, errcode.FileNotFound},
		{"write into missing dir", func() error { return write(filepath.Join(missing, "x")) }, control.CodeFileNotFound, errcode.FileNotFound},
		{"read a directory", func() error { return read(filepath.Join(dir, "d")) }, control.CodeIsADirectory, errcode.IsADirectory},
		{"read a device", func() error { return read("/dev/null") }, control.CodeNotRegular, errcode.NotARegularFile},
		{"write over a directory", func() error { return write(filepath.Join(dir, "d")) }, control.CodeIsADirectory, errcode.IsADirectory},
		{"list a file", func() error { return list(filepath.Join(dir, "f")) }, control.CodeNotADirectory, errcode.NotADirectory},
		{"a file as a parent", func() error { return read(filepath.Join(dir, "f", "x")) }, control.CodeNotADirectory, errcode.NotADirectory},
		{"name too long", func() error { return stat(filepath.Join(dir, string(bytes.Repeat([]byte("a"), 300)))) }, control.CodeNameTooLong, errcode.NameTooLong},
		{"symlink loop", func() error { return read(filepath.Join(dir, "loop")) }, control.CodeSymlinkLoop, errcode.SymlinkLoop},
		{"non-empty directory", func() error { return c.Remove(ctx, filepath.Join(dir, "open", "full"), "", false) }, control.CodeDirectoryNotEmpty, errcode.DirectoryNotEmpty},
		{"relative path", func() error { return read("etc/passwd") }, control.CodeInvalidRequest, errcode.InvalidRequest},
		{"dot-relative path", func() error { return stat("./x") }, control.CodeInvalidRequest, errcode.InvalidRequest},
		{"NUL in path", func() error { return stat("/tmp/a\x00b") }, control.CodeInvalidRequest, errcode.InvalidRequest},
		{"long path", func() error { return stat("/" + string(bytes.Repeat([]byte("a"), 5000))) }, control.CodeInvalidRequest, errcode.InvalidRequest},
		{"remove root", func() error { return c.Remove(ctx, "/", "", true) }, control.CodeInvalidRequest, errcode.InvalidRequest},
		{"unknown user", func() error { _, err := c.Stat(ctx, dir, "mallory"); return err }, control.CodeInvalidRequest, errcode.InvalidRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.op()
			var re *control.RemoteError
			if !errors.As(err, &re) || re.Code != tc.remote || !errors.Is(err, tc.code) || errcode.Of(err) != tc.code {
				t.Fatalf("err = %v, want remote %s mapped to %s", err, tc.remote, tc.code)
			}
		})
	}
}

// TestWriteNamesTheParentItCannotMake: a write (and a mkdir) with parents into a directory the
// user may not write says which directory it could not create, not that the user may not
// access a file that does not exist.
func TestWriteNamesTheParentItCannotMake(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the agent switches to uid 1000 only when it runs as root")
	}
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	dir := worldDir(t) // root's, 0755
	target := filepath.Join(dir, "nonexistent", "dir", "f")
	_, werr := c.WriteFile(ctx, control.WriteRequest{Path: target, MakeParents: true}, bytes.NewReader([]byte("x")))
	merr := c.Mkdir(ctx, target, "user", 0o755, true)
	for what, err := range map[string]error{"write": werr, "mkdir": merr} {
		var re *control.RemoteError
		if !errors.As(err, &re) || re.Code != control.CodePermissionDenied {
			t.Fatalf("%s: %v, want permission-denied", what, err)
		}
		if want := fmt.Sprintf("may not create the directory %q", filepath.Join(dir, "nonexistent")); !strings.Contains(re.Message, want) {
			t.Errorf("%s: %q does not say %s", what, re.Message, want)
		}
	}
}

// TestFilesAsUser checks that the agent does not lend the sandbox user root's permissions.
func TestFilesAsUser(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the agent switches to uid 1000 only when it runs as root")
	}
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	dir := worldDir(t)
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("root only"), 0o600)
	groupOnly := filepath.Join(dir, "group")
	os.WriteFile(groupOnly, []byte("root group"), 0o640)
	private := filepath.Join(dir, "private")
	os.Mkdir(private, 0o700)
	os.WriteFile(filepath.Join(private, "inner"), []byte("x"), 0o644)

	for _, p := range []string{secret, groupOnly} {
		if _, _, err := c.ReadFile(ctx, p, "user"); errcode.Of(err) != errcode.PermissionDenied {
			t.Fatalf("user read %s: %v", p, err)
		}
	}
	if _, err := c.List(ctx, private, ""); err == nil {
		t.Fatal("user listed a private root directory")
	}
	if _, err := c.Stat(ctx, filepath.Join(private, "inner"), ""); err == nil {
		t.Fatal("user stat'ed inside a private root directory")
	}
	if _, err := c.WriteFile(ctx, control.WriteRequest{Path: filepath.Join(private, "new")}, bytes.NewReader(nil)); err == nil {
		t.Fatal("user wrote into a private root directory")
	}
	if err := c.Remove(ctx, secret, "", false); err != nil {
		// The directory is root's and not writable by the user.
		var re *control.RemoteError
		if !errors.As(err, &re) || re.Code != control.CodePermissionDenied {
			t.Fatalf("remove: %v", err)
		}
	} else {
		t.Fatal("user removed a file in root's directory")
	}

	// The agent's own /proc entries are not the user's to read through it: a process may
	// always inspect itself, and the magic links would skip directory permissions.
	if _, _, err := c.ReadFile(ctx, "/proc/self/environ", "user"); errcode.Of(err) != errcode.PermissionDenied {
		t.Fatalf("user read the agent's environ: %v", err)
	}
	if _, _, err := c.ReadFile(ctx, "/proc/self/fd/0", "user"); err == nil {
		t.Fatal("user followed a magic link of the agent")
	}
	if _, err := c.List(ctx, "/proc/self/root/", "user"); err == nil {
		t.Fatal("user listed through a magic link of the agent")
	}

	// Root may.
	rc, _, err := c.ReadFile(ctx, secret, "root")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "root only" {
		t.Fatalf("root read %q", b)
	}

	// What the user writes is the user's.
	userDir := filepath.Join(dir, "home")
	os.Mkdir(userDir, 0o755)
	os.Chown(userDir, 1000, 1000)
	p := filepath.Join(userDir, "a", "b")
	if _, err := c.WriteFile(ctx, control.WriteRequest{Path: p, MakeParents: true}, bytes.NewReader([]byte("mine"))); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{p, filepath.Dir(p)} {
		var st os.FileInfo
		if st, err = os.Stat(q); err != nil {
			t.Fatal(err)
		}
		if uid, gid := ownerOf(st); uid != 1000 || gid != 1000 {
			t.Fatalf("%s owned by %d:%d, want 1000:1000", q, uid, gid)
		}
	}
}

func TestWriteAbortLeavesNothing(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	dir := userDir(t)
	path := filepath.Join(dir, "partial")
	_, err := c.WriteFile(context.Background(), control.WriteRequest{Path: path}, io.MultiReader(
		bytes.NewReader(make([]byte, 100<<10)), errReader{}))
	if err == nil {
		t.Fatal("write with a failing reader succeeded")
	}
	waitFor(t, "the temp file to go", 10e9, func() bool {
		ents, _ := os.ReadDir(dir)
		return len(ents) == 0
	})
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("source broke") }

// TestReadRacingRename: a file renamed over again and again while it is read (as a workload
// publishing progress does) always reads as one whole version, of the size ReadFile reported:
// the size comes from the file the agent opened, not from another lookup of the path.
func TestReadRacingRename(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	ctx := context.Background()
	dir := userDir(t)
	path := filepath.Join(dir, "progress")
	// Versions of growing length, so that a size taken from one and content from another
	// could not agree.
	version := func(i int) []byte { return bytes.Repeat([]byte{'a' + byte(i%26)}, 1+i%4000) }
	if err := os.WriteFile(path, version(0), 0o644); err != nil {
		t.Fatal(err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	// However the test ends, the writer ends before it (and before its directory goes).
	defer func() { close(stop); <-stopped }()
	var published atomic.Int64
	go func() {
		defer close(stopped)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tmp := filepath.Join(dir, "progress.tmp")
			if os.WriteFile(tmp, version(i), 0o644) != nil || os.Rename(tmp, path) != nil {
				t.Error("publishing a version failed")
				return
			}
			published.Add(1)
		}
	}()
	for range 300 {
		rc, size, err := c.ReadFile(ctx, path, "")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || int64(len(b)) != size || len(b) == 0 || !bytes.Equal(b, bytes.Repeat(b[:1], len(b))) {
			t.Fatalf("read %d bytes (%v) of a version reported as %d bytes: %.40q", len(b), err, size, b)
		}
	}
	if published.Load() == 0 {
		t.Fatal("no version was published while the file was read")
	}
	t.Logf("300 reads while the file was replaced %d times", published.Load())
}

// TestReadPseudoFile: a /proc file, whose size reads as 0 whatever it holds, is read to its
// end, its size reported as unknown.
func TestReadPseudoFile(t *testing.T) {
	t.Parallel()
	ta := startAgent(t)
	c := ta.dial(t)
	rc, size, err := c.ReadFile(context.Background(), "/proc/self/status", "root")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || size != control.UnknownSize || !bytes.Contains(b, []byte("Pid:")) {
		t.Fatalf("read /proc/self/status: size %d, %v: %q", size, err, b)
	}
}
