package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// smallFS is an ext4 file system of its own, in an image file on a loop device, mounted in a
// temporary directory: a state root that a test can fill, and make read-only, without
// touching the host's disk. It is made without reserved blocks, so that root (which bothyd
// is) meets ENOSPC when the file system is full rather than eating the reserve.
type smallFS struct {
	t   testing.TB
	Dir string
}

// newSmallFS makes, attaches and mounts a file system of mb MiB; it is unmounted (and the
// loop device detached, by autoclear) when the test ends.
func newSmallFS(t testing.TB, mb int) *smallFS {
	t.Helper()
	requireRoot(t)
	for _, tool := range []string{"mkfs.ext4", "mount", "umount", "fallocate"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: no small file system to fill", tool)
		}
	}
	base := t.TempDir()
	img, dir := filepath.Join(base, "fs.img"), filepath.Join(base, "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	runTool(t, "truncate", "-s", fmt.Sprintf("%dM", mb), img)
	runTool(t, "mkfs.ext4", "-q", "-F", "-m", "0", img)
	if out, err := exec.Command("mount", "-o", "loop,errors=remount-ro", img, dir).CombinedOutput(); err != nil {
		t.Skipf("mounting a loop file system: %v: %s", err, out)
	}
	t.Cleanup(func() {
		// Sandboxes are reaped by their daemon's cleanup, which runs before this one.
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			_ = exec.Command("umount", "-l", dir).Run()
			t.Logf("unmounting the small file system: %v: %s (detached lazily)", err, out)
		}
	})
	return &smallFS{t: t, Dir: dir}
}

func runTool(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// fill takes every free block of the file system with one file, from the host.
func (f *smallFS) fill() string {
	f.t.Helper()
	path := filepath.Join(f.Dir, "root", "host-fill")
	var st unix.Statfs_t
	var free int64
	// fallocate wants the size; what it cannot have it refuses whole, so ask for a little
	// less, then take the rest a block at a time. Sandboxes may write meanwhile (the chaos
	// suite's do), so a refusal is followed by a fresh look at what is free.
	for attempt := 1; ; attempt++ {
		if err := unix.Statfs(f.Dir, &st); err != nil {
			f.t.Fatal(err)
		}
		free = int64(st.Bavail) * st.Bsize
		out, err := exec.Command("fallocate", "-l", fmt.Sprint(max(free-free%st.Bsize-16*st.Bsize, st.Bsize)), path).CombinedOutput()
		if err == nil {
			break
		}
		if attempt == 5 {
			f.t.Fatalf("fallocate %s: %v: %s", path, err, out)
		}
	}
	for range 64 {
		if err := exec.Command("fallocate", "-n", "-o", "0", "-l", fmt.Sprint(free+64*st.Bsize), path).Run(); err != nil {
			break
		}
	}
	_ = unix.Statfs(f.Dir, &st)
	f.t.Logf("filled the state root: %d blocks of %d bytes left", st.Bavail, st.Bsize)
	return path
}

// readOnly makes the file system refuse writes, as the kernel does after an I/O error: a
// plain read-only remount when nothing holds a file open for writing, or else ext4's own
// error path (errors=remount-ro), which no open file can stop. It reports whether a plain
// remount did it, after which readWrite can undo it.
func (f *smallFS) readOnly() bool {
	f.t.Helper()
	if exec.Command("mount", "-o", "remount,ro", f.Dir).Run() == nil {
		return true
	}
	src, err := exec.Command("findmnt", "-no", "SOURCE", f.Dir).Output()
	if err != nil {
		f.t.Fatalf("findmnt %s: %v", f.Dir, err)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(strings.TrimSpace(string(src))), "trigger_fs_error")
	if err := os.WriteFile(trigger, []byte("bothyd test\n"), 0o200); err != nil {
		f.t.Skipf("cannot make the file system read-only (busy, and %s: %v)", trigger, err)
	}
	return false
}

func (f *smallFS) readWrite() {
	f.t.Helper()
	runTool(f.t, "mount", "-o", "remount,rw", f.Dir)
}

// info is the part of /v1/info these tests read.
type storageInfo struct {
	Storage struct {
		State string `json:"state"`
		Root  string `json:"root"`
		Path  string `json:"path"`
	} `json:"storage"`
}

func (d *daemon) storageState() string {
	d.t.Helper()
	return decode[storageInfo](d.t, d.do("GET", "/v1/info", nil, nil), 200).Storage.State
}

// ids lists the ids of a list answer.
func (d *daemon) ids(path string) []string {
	d.t.Helper()
	var page struct {
		Items []map[string]any `json:"items"`
	}
	r := d.do("GET", path, nil, nil)
	if r.Status != 200 {
		d.t.Fatalf("GET %s: %d %s", path, r.Status, r.Body)
	}
	if err := json.Unmarshal(r.Body, &page); err != nil {
		d.t.Fatal(err)
	}
	var out []string
	for _, it := range page.Items {
		for _, k := range []string{"id", "name"} {
			if v, ok := it[k].(string); ok {
				out = append(out, v)
				break
			}
		}
	}
	return out
}

// TestStorageFull runs bothyd on a small file system, fills it from inside a sandbox
// without a disk of its own and from the host, and checks that every write answers 507
// storage-full naming the state root and leaves nothing behind, that reads, stops and
// deletes still work, and that once space is freed everything works and the state root
// checks clean.
func TestStorageFull(t *testing.T) {
	requireRoot(t)
	fs := newSmallFS(t, 64)
	root := filepath.Join(fs.Dir, "root")
	d := startDaemon(t, func(d *daemon) { d.Root = root }, withArgs("--log-level", "info"))
	unbounded := map[string]any{"disk_mb": 0}
	for _, id := range []string{"keep", "hog", "victim"} {
		decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true, "resources": unbounded}), 201)
	}
	g := decode[generationJSON](t, func() response {
		d.doJSON("POST", "/v1/sandboxes/victim/stop", nil)
		decode[map[string]any](t, d.doJSON("POST", "/v1/templates", map[string]any{"name": "t0"}), 201)
		return d.doJSON("POST", "/v1/templates/t0/generations", map[string]any{"sandbox": "victim"})
	}(), 201)
	if d.storageState() != "ok" {
		t.Fatalf("the state root is not ok before it is filled")
	}

	// From inside: a sandbox without a disk of its own writes to the state root's file
	// system until it is full; then from the host, every block that is left.
	got := d.exec("hog", map[string]any{"command": []string{"sh", "-c", "dd if=/dev/zero of=/home/user/fill bs=1M 2>&1; true"}, "timeout_ms": 120000})
	if !strings.Contains(got.Stdout, "No space left") {
		t.Fatalf("the hog did not fill the state root: %+v", got)
	}
	// A checkpoint taken before the fill: deleting it must record the removal, which a full
	// state root refuses whole.
	decode[map[string]any](t, d.doJSON("POST", "/v1/sandboxes/keep/checkpoints", map[string]any{"name": "before"}), 201)
	hostFill := fs.fill()

	full := func(what string, r response) {
		t.Helper()
		p := wantProblem(t, r, 507, "storage-full")
		if !strings.Contains(p.Detail, root) {
			t.Errorf("%s: the detail %q does not name the state root %s", what, p.Detail, root)
		}
	}
	t.Run("writes answer 507", func(t *testing.T) {
		d := d.in(t)
		full("create", d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "f-new", "resources": unbounded}))
		full("create with a disk", d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "f-disk"}))
		full("create and start", d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "f-start", "start": true, "resources": unbounded}))
		full("clone", d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "f-clone", "template": "t0"}))
		full("template create", d.doJSON("POST", "/v1/templates", map[string]any{"name": "ft"}))
		full("capture", d.doJSON("POST", "/v1/templates/t0/generations", map[string]any{"sandbox": "victim"}))
		// A tombstone is a record written before it takes effect: refused whole, the
		// generation stays eligible.
		full("tombstone", d.doJSON("POST", "/v1/templates/t0/generations/"+g.ID+"/tombstone", nil))
		if st := decode[generationJSON](t, d.do("GET", "/v1/templates/t0/generations/"+g.ID, nil, nil), 200); st.State == "tombstoned" {
			t.Errorf("after a tombstone refused for space, the generation is %q", st.State)
		}
		full("upload", d.do("PUT", "/v1/sandboxes/keep/files?path=/home/user/up", strings.NewReader(strings.Repeat("x", 1<<20)), nil))
		full("checkpoint delete", d.doJSON("DELETE", "/v1/sandboxes/keep/checkpoints/before", nil))
		if n := len(decode[struct{ Items []checkpointJSON }](t, d.do("GET", "/v1/sandboxes/keep/checkpoints", nil, nil), 200).Items); n != 1 {
			t.Errorf("after a checkpoint delete refused for space, keep has %d checkpoints, want 1", n)
		}
		// A lifetime is recorded before it is set: refused whole.
		full("timeout", d.doJSON("POST", "/v1/sandboxes/keep/timeout", map[string]any{"timeout_s": 600}))
		// A pause records itself before it freezes: refused whole, the sandbox runs on.
		full("pause", d.doJSON("POST", "/v1/sandboxes/keep/pause", nil))
		if st := decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/keep", nil, nil), 200); st.State != "running" {
			t.Errorf("after a pause refused for space, keep is %s, want running", st.State)
		}
		if r := d.exec("keep", map[string]any{"command": []string{"true"}}); r.ExitCode != 0 {
			t.Errorf("after a pause refused for space, an exec in keep exits %d: %s", r.ExitCode, r.Stderr)
		}
	})

	t.Run("nothing half-made", func(t *testing.T) {
		d := d.in(t)
		for _, id := range d.ids("/v1/sandboxes") {
			if strings.HasPrefix(id, "f-") {
				t.Errorf("a failed create left sandbox %s", id)
			}
		}
		for _, name := range d.ids("/v1/templates") {
			if name == "ft" {
				t.Errorf("a failed template create left template %s", name)
			}
		}
		if gens := d.ids("/v1/templates/t0/generations"); len(gens) != 1 || gens[0] != g.ID {
			t.Errorf("a failed capture changed t0's generations: %v, want [%s]", gens, g.ID)
		}
		if entries, err := os.ReadDir(filepath.Join(root, "sandboxes")); err == nil {
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), "f-") {
					t.Errorf("a failed create left the directory sandboxes/%s", e.Name())
				}
			}
		}
	})

	t.Run("reads, stops and deletes work", func(t *testing.T) {
		d := d.in(t)
		var info storageInfo
		if err := json.Unmarshal(d.do("GET", "/v1/info", nil, nil).Body, &info); err != nil || info.Storage.State != "full" || info.Storage.Root != root {
			t.Errorf("/v1/info storage = %+v (%v), want full at %s", info.Storage, err, root)
		}
		if n := d.scrape()[`bothy_storage_faults_total{code="storage-full"}`]; n < 1 {
			t.Errorf("bothy_storage_faults_total{code=storage-full} = %v, want at least 1", n)
		}
		decode[sandboxJSON](t, d.do("GET", "/v1/sandboxes/keep", nil, nil), 200)
		if r := d.do("GET", "/v1/sandboxes/keep/logs", nil, nil); r.Status != 200 {
			t.Errorf("logs on a full disk: %d %s", r.Status, r.Body)
		}
		if got := d.exec("keep", map[string]any{"command": []string{"cat", "/etc/os-release"}}); got.ExitCode != 0 {
			t.Errorf("exec of a reader on a full disk: %+v", got)
		}
		if r := d.do("GET", "/v1/sandboxes/keep/files?path=/etc/hostname", nil, nil); r.Status != 200 {
			t.Errorf("reading a file on a full disk: %d %s", r.Status, r.Body)
		}
		if r := d.doJSON("POST", "/v1/sandboxes/hog/stop", nil); r.Status != 200 {
			t.Errorf("stop on a full disk: %d %s", r.Status, r.Body)
		}
		if r := d.doJSON("DELETE", "/v1/sandboxes/hog", nil); r.Status != 204 {
			t.Errorf("delete on a full disk: %d %s", r.Status, r.Body)
		}
	})

	// Free the space: the server finds out by itself, and everything works again.
	if err := os.Remove(hostFill); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the state root to read ok again", func() bool { return d.storageState() == "ok" })
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "f-new", "resources": unbounded}), 201)
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/f-new/start", nil), 200)
	decode[map[string]any](t, d.doJSON("POST", "/v1/templates", map[string]any{"name": "ft"}), 201)
	decode[generationJSON](t, d.doJSON("POST", "/v1/templates/ft/generations", map[string]any{"sandbox": "victim"}), 201)
	decode[cloneJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "f-clone", "template": "ft", "start": true}), 201)
	if r := d.do("PUT", "/v1/sandboxes/keep/files?path=/home/user/up", strings.NewReader("after\n"), nil); r.Status != 204 {
		t.Fatalf("upload after space was freed: %d %s", r.Status, r.Body)
	}
	mustCheckClean(t, root, "after space was freed, beside the server")
}

// TestStorageReadOnly makes the state root's file system read-only under a running server:
// writes answer 503 storage-unavailable and leave nothing, reads keep working, and once it
// is writable again (when a plain remount could do it) everything works and checks clean.
func TestStorageReadOnly(t *testing.T) {
	requireRoot(t)
	fs := newSmallFS(t, 64)
	root := filepath.Join(fs.Dir, "root")
	d := startDaemon(t, func(d *daemon) { d.Root = root }, withArgs("--log-level", "info", "--default-disk-mb", "0"))
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "keep"}), 201)
	decode[map[string]any](t, d.doJSON("POST", "/v1/templates", map[string]any{"name": "t0"}), 201)

	plain := fs.readOnly()
	unavailable := func(what string, r response) {
		t.Helper()
		p := wantProblem(t, r, 503, "storage-unavailable")
		if !strings.Contains(p.Detail, root) {
			t.Errorf("%s: the detail %q does not name the state root %s", what, p.Detail, root)
		}
	}
	unavailable("create", d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "f-new"}))
	unavailable("start", d.doJSON("POST", "/v1/sandboxes/keep/start", nil))
	unavailable("template create", d.doJSON("POST", "/v1/templates", map[string]any{"name": "ft"}))
	if got := d.storageState(); got != "unavailable" {
		t.Errorf("/v1/info storage state %q on a read-only root, want unavailable", got)
	}
	if n := d.scrape()[`bothy_storage_faults_total{code="storage-unavailable"}`]; n < 1 {
		t.Errorf("bothy_storage_faults_total{code=storage-unavailable} = %v, want at least 1", n)
	}
	if ids := d.ids("/v1/sandboxes"); len(ids) != 1 || ids[0] != "keep" {
		t.Errorf("sandboxes on a read-only root: %v, want [keep]", ids)
	}
	if names := d.ids("/v1/templates"); len(names) != 1 || names[0] != "t0" {
		t.Errorf("templates on a read-only root: %v, want [t0]", names)
	}
	if !plain {
		t.Log("the file system went read-only through ext4's error path; it stays so until it is checked, so recovery is not tried")
		return
	}
	fs.readWrite()
	waitFor(t, 30*time.Second, "the state root to read ok again", func() bool { return d.storageState() == "ok" })
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes/keep/start", nil), 200)
	decode[sandboxJSON](t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "f-new"}), 201)
	mustCheckClean(t, root, "after the root was writable again, beside the server")
}
