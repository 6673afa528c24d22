package template

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"golang.org/x/sys/unix"
)

// TestCaptureCopiesLayer checks that a capture keeps what an overlayfs upper layer holds:
// whiteouts (character devices 0/0), opaque directories (trusted.overlay.opaque), modes,
// set-id bits, ownership, symbolic links (not followed), hard links, FIFOs, xattrs and times.
func TestCaptureCopiesLayer(t *testing.T) {
	t.Parallel()
	root := os.Geteuid() == 0
	src := t.TempDir()
	p := func(name string) string { return filepath.Join(src, name) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(p("file"), []byte("content"), 0o600))
	must(os.Chmod(p("file"), 0o751))
	must(os.WriteFile(p("empty"), nil, 0o644))
	must(os.Symlink("file", p("link")))
	must(os.Symlink("/etc/shadow", p("outside")))
	must(os.WriteFile(p("hard1"), []byte("shared"), 0o644))
	must(os.Link(p("hard1"), p("hard2")))
	must(syscall.Mkfifo(p("fifo"), 0o640))
	must(os.MkdirAll(p("ro/sub"), 0o755))
	must(os.WriteFile(p("ro/sub/f"), []byte("deep"), 0o644))
	must(os.Chmod(p("ro"), 0o555))
	userXattr := unix.Setxattr(p("file"), "user.note", []byte("kept"), 0) == nil
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	must(os.Chtimes(p("file"), mtime, mtime))
	must(unix.Lutimes(p("link"), []unix.Timeval{unix.NsecToTimeval(mtime.UnixNano()), unix.NsecToTimeval(mtime.UnixNano())}))
	if root {
		must(unix.Mknod(p("deleted"), unix.S_IFCHR, 0))
		must(os.Mkdir(p("opaque"), 0o755))
		must(unix.Setxattr(p("opaque"), "trusted.overlay.opaque", []byte("y"), 0))
		must(os.WriteFile(p("suid"), []byte("#!"), 0o755))
		must(os.Chown(p("suid"), 1234, 5678))
		must(unix.Chmod(p("suid"), 0o4755))
		must(os.Lchown(p("link"), 1234, 5678))
	}
	must(os.Chtimes(p("ro"), mtime, mtime))

	e := newEnv(t)
	if _, err := e.s.CreateTemplate(ctxT(t), "py"); err != nil {
		t.Fatal(err)
	}
	g, err := e.s.Capture(ctxT(t), "py", src, testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len("content") + len("shared") + len("deep") + map[bool]int{true: 2}[root]); g.SizeBytes != want {
		t.Fatalf("size %d; want %d", g.SizeBytes, want)
	}
	dst, _ := e.s.PayloadDir("py", g.ID)
	q := func(name string) string { return filepath.Join(dst, name) }
	lst := func(path string) *unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		must(unix.Lstat(path, &st))
		return &st
	}
	if b, _ := os.ReadFile(q("file")); string(b) != "content" {
		t.Fatalf("file content %q", b)
	}
	if st := lst(q("file")); st.Mode&0o7777 != 0o751 || time.Unix(st.Mtim.Unix()).UTC() != mtime {
		t.Fatalf("file mode %o mtime %v", st.Mode&0o7777, time.Unix(st.Mtim.Unix()))
	}
	if st := lst(q("ro")); st.Mode&0o7777 != 0o555 || time.Unix(st.Mtim.Unix()).UTC() != mtime {
		t.Fatalf("dir mode %o mtime %v", st.Mode&0o7777, time.Unix(st.Mtim.Unix()))
	}
	if b, _ := os.ReadFile(q("ro/sub/f")); string(b) != "deep" {
		t.Fatalf("deep file %q", b)
	}
	if target, err := os.Readlink(q("outside")); err != nil || target != "/etc/shadow" {
		t.Fatalf("outside link %q, %v", target, err)
	}
	if st := lst(q("link")); st.Mode&unix.S_IFMT != unix.S_IFLNK || time.Unix(st.Mtim.Unix()).UTC() != mtime {
		t.Fatalf("link %o %v", st.Mode, time.Unix(st.Mtim.Unix()))
	}
	if a, b := lst(q("hard1")), lst(q("hard2")); a.Ino != b.Ino || a.Nlink != 2 {
		t.Fatalf("hard links not kept: %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if st := lst(q("fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o777 != 0o640 {
		t.Fatalf("fifo %o", st.Mode)
	}
	if userXattr {
		buf := make([]byte, 16)
		n, err := unix.Getxattr(q("file"), "user.note", buf)
		if err != nil || string(buf[:n]) != "kept" {
			t.Fatalf("user xattr %q, %v", buf[:n], err)
		}
	}
	if root {
		if st := lst(q("deleted")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Fatalf("whiteout %o rdev %d", st.Mode, st.Rdev)
		}
		buf := make([]byte, 16)
		n, err := unix.Getxattr(q("opaque"), "trusted.overlay.opaque", buf)
		if err != nil || !bytes.Equal(buf[:n], []byte("y")) {
			t.Fatalf("opaque xattr %q, %v", buf[:n], err)
		}
		if st := lst(q("suid")); st.Mode&0o7777 != 0o4755 || st.Uid != 1234 || st.Gid != 5678 {
			t.Fatalf("suid file mode %o owner %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
		}
		if st := lst(q("link")); st.Uid != 1234 {
			t.Fatalf("link owner %d", st.Uid)
		}
	} else {
		t.Log("not root: whiteouts, trusted xattrs and ownership are not checked (CI runs as root)")
	}
	// The source is untouched.
	if st := lst(p("ro")); st.Mode&0o7777 != 0o555 {
		t.Fatal("source changed")
	}
	// A read-only tree is removed by retirement.
	if out, err := e.s.Retire(ctxT(t), "py", g.ID, false, nil); err != nil || out != Retired {
		t.Fatal(out, err)
	}
}

func TestCaptureRefusesLinkSource(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if _, err := e.s.CreateTemplate(ctxT(t), "py"); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "upper")
	if err := os.Symlink(smallLayer(t), link); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Capture(ctxT(t), "py", link, testKey, nil); err == nil {
		t.Fatal("captured through a link")
	}
	if gens, _ := e.s.Generations("py", e.clock.get()); len(gens) != 0 {
		t.Fatalf("generations %+v", gens)
	}
}

func TestStagingCleanup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	tdir := filepath.Join(e.s.Path(), "py")
	dead := filepath.Join(tdir, ".g000007.0123456789abcdef.tmp")
	live := filepath.Join(tdir, ".g000008.0123456789abcdef.tmp")
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(filepath.Join(d, "payload", "ro"), 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(d, "payload", "ro"), 0o500)
	}
	recTemp := filepath.Join(tdir, ".template.json.0123456789abcdef.tmp")
	os.WriteFile(recTemp, []byte("{"), 0o600)
	foreign := filepath.Join(tdir, "notes.txt")
	os.WriteFile(foreign, []byte("mine"), 0o600)
	// A live capture holds an flock on its staging directory.
	f, err := os.Open(live)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	problems, err := e.s.Check(ctxT(t), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, p := range problems {
		kinds = append(kinds, string(p.Kind)+" "+p.Entry)
	}
	slices.Sort(kinds)
	want := []string{"foreign-entry py/notes.txt", "staging-leftover py/.g000007.0123456789abcdef.tmp", "staging-leftover py/.template.json.0123456789abcdef.tmp"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("check %v; want %v", kinds, want)
	}
	e.log.take()
	if _, err := e.s.Tombstone(ctxT(t), "py", gen); err != nil {
		t.Fatal(err)
	}
	if got := e.log.take(); !slices.Contains(got, StepCleanStaging) {
		t.Fatalf("steps %v", got)
	}
	if exists(dead) || exists(recTemp) || !exists(live) || !exists(foreign) {
		t.Fatalf("dead %v, temp %v, live %v, foreign %v", exists(dead), exists(recTemp), exists(live), exists(foreign))
	}
	// The foreign entry keeps the template's directory, and is named.
	_, err = e.s.DeleteTemplate(ctxT(t), "py", false, nil)
	wantCode(t, err, errcode.ForeignFiles)
	if !strings.Contains(err.Error(), "notes.txt") {
		t.Fatal(err)
	}
}

func TestForeignEntryInGeneration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	foreign := filepath.Join(e.s.Path(), "py", gen, "core")
	os.WriteFile(foreign, []byte("x"), 0o600)
	_, err := e.s.Retire(ctxT(t), "py", gen, false, nil)
	wantCode(t, err, errcode.ForeignFiles)
	if !strings.Contains(err.Error(), "core") || !exists(foreign) {
		t.Fatal(err)
	}
	if exists(filepath.Join(e.s.Path(), "py", gen, PayloadDir)) {
		t.Fatal("payload kept")
	}
}

func TestCheckRepairs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g1 := e.template(t, "py")
	g2 := e.capture(t, "py")
	g3 := e.capture(t, "py")
	l := e.mustClone(t, "py", g1, "a")
	e.mustClone(t, "py", g1, "b")
	// a's removal crashed after clone.json went.
	if err := RemoveBinding(filepath.Join(e.root, "sandboxes", "a")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(e.s.Path(), "py", g2, PayloadDir))
	os.Remove(filepath.Join(e.s.Path(), "py", g3, IndexName))
	os.WriteFile(filepath.Join(e.s.Path(), "stray"), nil, 0o600)
	problems, err := e.s.Check(ctxT(t), e.bindingExists(), true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[ProblemKind]Problem{}
	for _, p := range problems {
		got[p.Kind] = p
	}
	if p := got[LeaseWithoutBinding]; p.Lease != l.ID || !p.Repaired {
		t.Errorf("lease without binding: %+v", p)
	}
	if p := got[IndexWithoutPayload]; p.Generation != g2 || !p.Repaired {
		t.Errorf("index without payload: %+v", p)
	}
	if p := got[PayloadWithoutIndex]; p.Generation != g3 || !p.Repaired {
		t.Errorf("payload without index: %+v", p)
	}
	if p := got[ForeignEntry]; p.Entry != "stray" || p.Repaired {
		t.Errorf("foreign: %+v", p)
	}
	if len(problems) != 4 {
		t.Errorf("problems %v", problems)
	}
	problems, err = e.s.Check(ctxT(t), e.bindingExists(), false)
	if err != nil || len(problems) != 1 || problems[0].Kind != ForeignEntry {
		t.Fatalf("after repair: %v, %v", problems, err)
	}
	if leases, _ := e.s.Leases("py", g1); len(leases) != 1 || leases[0].Sandbox != "b" {
		t.Fatalf("leases %+v", leases)
	}
	if gens, _ := e.s.Generations("py", e.clock.get()); len(gens) != 1 || gens[0].ID != g1 {
		t.Fatalf("generations %+v", gens)
	}
	if !errors.Is(errcode.New(errcode.Internal, ""), errcode.Internal) {
		t.Fatal("errcode")
	}
}

// TestLinksInStoreNotFollowed puts links where a template and a generation directory would
// be: they are skipped by listings, reported by Check, and never followed.
func TestLinksInStoreNotFollowed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(e.s.Path(), "evil")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(e.s.Path(), "py", gen), filepath.Join(e.s.Path(), "py", "g000009")); err != nil {
		t.Fatal(err)
	}
	list, err := e.s.Templates(e.clock.get())
	if err != nil || len(list) != 1 || list[0].Name != "py" || list[0].Generations != 1 {
		t.Fatalf("templates %+v, %v", list, err)
	}
	if _, err := e.s.Template("evil", e.clock.get()); err == nil {
		t.Fatal("a link was followed as a template")
	}
	if _, err := e.s.Generation("py", "g000009", e.clock.get()); err == nil {
		t.Fatal("a link was followed as a generation")
	}
	if _, err := e.s.CreateTemplate(ctxT(t), "evil"); err == nil {
		t.Fatal("a template was created through a link")
	}
	if names, _ := os.ReadDir(outside); len(names) != 0 {
		t.Fatalf("something was written through the link: %v", names)
	}
	problems, err := e.s.Check(ctxT(t), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	for _, p := range problems {
		if p.Kind != ForeignEntry || p.Repaired {
			t.Fatalf("problem %v", p)
		}
		entries = append(entries, p.Entry)
	}
	if !slices.Equal(entries, []string{"evil", "py/g000009"}) {
		t.Fatalf("check %v", entries)
	}
}

// TestCaptureLayersMerges checks a capture of a layer over another (a clone's own layer over
// its generation's payload): the upper's files replace the lower's, its directories merge into
// the lower's unless opaque, its whiteouts hide and are kept, and the size is the result's.
func TestCaptureLayersMerges(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("whiteouts and opaque marks need root")
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	lower, upper := t.TempDir(), t.TempDir()
	l := func(name string) string { return filepath.Join(lower, name) }
	u := func(name string) string { return filepath.Join(upper, name) }
	must(os.MkdirAll(l("a"), 0o755))
	must(os.WriteFile(l("a/kept"), []byte("kept"), 0o644))
	must(os.WriteFile(l("a/changed"), []byte("old content"), 0o644))
	must(os.WriteFile(l("gone"), []byte("gone"), 0o644))
	must(os.MkdirAll(l("opaque/sub"), 0o755))
	must(os.WriteFile(l("opaque/sub/hidden"), []byte("hidden"), 0o644))
	must(os.WriteFile(l("became-dir"), []byte("file"), 0o644))
	must(os.MkdirAll(l("became-file/deep"), 0o755))
	must(unix.Mknod(l("deleted-below"), unix.S_IFCHR, 0)) // the generation's own whiteout

	must(os.MkdirAll(u("a"), 0o700))
	must(os.WriteFile(u("a/changed"), []byte("new"), 0o600))
	must(os.WriteFile(u("a/added"), []byte("added"), 0o644))
	must(unix.Mknod(u("gone"), unix.S_IFCHR, 0))
	must(os.Mkdir(u("opaque"), 0o755))
	must(unix.Setxattr(u("opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(u("opaque/only"), []byte("only"), 0o644))
	must(os.MkdirAll(u("became-dir"), 0o755))
	must(os.WriteFile(u("became-dir/in"), []byte("in"), 0o644))
	must(os.WriteFile(u("became-file"), []byte("f"), 0o644))

	e := newEnv(t)
	if _, err := e.s.CreateTemplate(ctxT(t), "py"); err != nil {
		t.Fatal(err)
	}
	lf, err := os.Open(lower)
	must(err)
	defer lf.Close()
	uf, err := os.Open(upper)
	must(err)
	defer uf.Close()
	g, err := e.s.CaptureLayers(ctxT(t), "py", []*os.File{lf, uf}, testKey, nil)
	must(err)
	dst, _ := e.s.PayloadDir("py", g.ID)
	q := func(name string) string { return filepath.Join(dst, name) }
	content := map[string]string{"a/kept": "kept", "a/changed": "new", "a/added": "added", "opaque/only": "only", "became-dir/in": "in", "became-file": "f"}
	var size int64
	for name, want := range content {
		if b, err := os.ReadFile(q(name)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v; want %q", name, b, err, want)
		}
		size += int64(len(want))
	}
	if g.SizeBytes != size {
		t.Errorf("size %d; want %d, the merged payload's", g.SizeBytes, size)
	}
	if fi, err := os.Stat(q("a/changed")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("a/changed keeps the upper's mode: %v %v", fi, err)
	}
	if fi, err := os.Stat(q("a")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("a merged directory takes the upper's mode: %v %v", fi, err)
	}
	for _, name := range []string{"gone", "deleted-below"} {
		var st unix.Stat_t
		if err := unix.Lstat(q(name), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("%s is not a whiteout: %+v %v", name, st, err)
		}
	}
	for _, name := range []string{"opaque/sub", "became-file/deep"} {
		if _, err := os.Lstat(q(name)); !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("%s should be hidden: %v", name, err)
		}
	}
	b := make([]byte, 4)
	if n, err := unix.Getxattr(q("opaque"), "trusted.overlay.opaque", b); err != nil || string(b[:n]) != "y" {
		t.Errorf("the opaque mark is lost: %v", err)
	}
}

// TestCaptureHooks: Hold comes before the copy reads, Release once after it, and the held time
// is the generation's capture pause, also when read back; a capture that fails releases too,
// and a Hold that fails fails the capture with nothing captured.
func TestCaptureHooks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if _, err := e.s.CreateTemplate(ctxT(t), "held"); err != nil {
		t.Fatal(err)
	}
	open := func(dir string) []*os.File {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return []*os.File{f}
	}
	var calls []string
	hooks := CaptureHooks{
		Progress: func(copied, total int64) {
			if len(calls) == 0 || calls[len(calls)-1] != "progress" {
				calls = append(calls, "progress")
			}
		},
		Hold:    func() error { calls = append(calls, "hold"); return nil },
		Release: func() time.Duration { calls = append(calls, "release"); return 1500 * time.Microsecond },
		Source:  &Source{Sandbox: "clone-1", Template: "parent", Generation: "g000007"},
	}
	g, err := e.s.CaptureLayersWith(ctxT(t), "held", open(smallLayer(t)), testKey, hooks)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(calls, ","); got != "hold,progress,release" {
		t.Fatalf("hooks called as %s; want hold,progress,release", got)
	}
	if g.CapturePauseMS != 1 {
		t.Fatalf("capture pause %d ms; want 1", g.CapturePauseMS)
	}
	if back, err := e.s.Generation("held", g.ID, e.clock.get()); err != nil || back.CapturePauseMS != 1 || back.Source == nil || *back.Source != *hooks.Source {
		t.Fatalf("read back: %+v, %v", back, err)
	}
	// A source that names what this service could not have made is not recorded.
	bad := hooks
	bad.Source = &Source{Sandbox: "clone-1", Template: "parent", Generation: "../g1"}
	calls = nil
	if _, err := e.s.CaptureLayersWith(ctxT(t), "held", open(smallLayer(t)), testKey, bad); err == nil {
		t.Fatal("a capture with a source naming ../g1 as its parent succeeded")
	}

	// A copy that fails (its layer is not a directory tree it can read) releases.
	calls = nil
	gone := t.TempDir()
	layers := open(gone)
	layers[0].Close()
	if _, err := e.s.CaptureLayersWith(ctxT(t), "held", layers, testKey, hooks); err == nil {
		t.Fatal("a capture of a closed layer succeeded")
	}
	if got := strings.Join(calls, ","); got != "hold,release" {
		t.Fatalf("hooks of a failed capture called as %s; want hold,release", got)
	}

	calls = nil
	hooks.Hold = func() error { return errors.New("the test refuses to hold") }
	if _, err := e.s.CaptureLayersWith(ctxT(t), "held", open(smallLayer(t)), testKey, hooks); err == nil {
		t.Fatal("a capture whose hold failed succeeded")
	}
	if len(calls) != 0 {
		t.Fatalf("a capture whose hold failed called %v", calls)
	}
	gens, err := e.s.Generations("held", e.clock.get())
	if err != nil || len(gens) != 1 {
		t.Fatalf("generations after the failures: %d, %v; want the one that succeeded", len(gens), err)
	}
}

// TestRemoveLeftovers is the start-up's clean: the temp files a SIGKILL mid-write leaves beside
// a template's and a generation's records and leases go, and so does a dead capture's staging;
// a live capture's staging, a foreign file and the records themselves stay, and check finds
// nothing left to repair but the foreign file.
func TestRemoveLeftovers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	gen := e.template(t, "py")
	tdir := filepath.Join(e.s.Path(), "py")
	gdir := filepath.Join(tdir, gen)
	dead := filepath.Join(tdir, ".g000007.0123456789abcdef.tmp")
	live := filepath.Join(tdir, ".g000008.0123456789abcdef.tmp")
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(filepath.Join(d, "payload"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(gdir, LeasesDir), 0o700); err != nil {
		t.Fatal(err)
	}
	temps := []string{
		filepath.Join(tdir, ".template.json.0123456789abcdef.tmp"),
		filepath.Join(gdir, ".tombstone.json.0123456789abcdef.tmp"),
		filepath.Join(gdir, ".index.json.0123456789abcdef.tmp"),
		filepath.Join(gdir, LeasesDir, "."+leasePrefix+"0123456789abcdef"+leaseExt+".0123456789abcdef.tmp"),
	}
	for _, p := range temps {
		if err := os.WriteFile(p, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	foreign := filepath.Join(gdir, "notes.txt")
	os.WriteFile(foreign, []byte("mine"), 0o600)
	f, err := os.Open(live)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	before, err := e.s.Check(ctxT(t), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.RemoveLeftovers(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, p := range append(temps, dead) {
		if exists(p) {
			t.Errorf("%s survived RemoveLeftovers", p)
		}
	}
	for _, p := range []string{live, foreign, filepath.Join(tdir, TemplateRecordName), filepath.Join(gdir, IndexName), filepath.Join(gdir, PayloadDir)} {
		if !exists(p) {
			t.Errorf("%s was removed", p)
		}
	}
	after, err := e.s.Check(ctxT(t), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, p := range after {
		kinds = append(kinds, string(p.Kind)+" "+p.Entry)
	}
	want := []string{"foreign-entry py/" + gen + "/notes.txt"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("check after RemoveLeftovers: %v; want %v (before: %d problems)", kinds, want, len(before))
	}
	if len(before) < len(temps)+1 {
		t.Fatalf("check before found only %v", before)
	}
}
