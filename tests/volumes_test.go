package tests

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bothy/bothy/platform"
)

// volumeJSON is the part of a volume the tests look at.
type volumeJSON struct {
	Name      string   `json:"name"`
	SizeMB    int      `json:"size_mb"`
	UsedBytes int64    `json:"used_bytes"`
	Sandboxes []string `json:"sandboxes"`
}

type volumeEntryJSON struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	Type   string `json:"type"`
	Size   int64  `json:"size"`
	UID    int    `json:"uid"`
	GID    int    `json:"gid"`
	Target string `json:"target"`
}

// startVolumeDaemon starts bothyd for a test of volumes, which need root; the harness
// detaches the volumes' host mounts when the test ends (reapSandboxes).
func startVolumeDaemon(t *testing.T) *daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("volumes need root (loop devices and mounts)")
	}
	return startDaemon(t)
}

func (d *daemon) createVolume(name string, sizeMB int) volumeJSON {
	d.t.Helper()
	body := map[string]any{"name": name}
	if sizeMB > 0 {
		body["size_mb"] = sizeMB
	}
	return decode[volumeJSON](d.t, d.doJSON("POST", "/v1/volumes", body), 201)
}

// createWithVolumes makes and starts a sandbox that mounts vols; it is deleted when the test
// ends.
func (d *daemon) createWithVolumes(id string, vols ...map[string]any) {
	d.t.Helper()
	r := d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": id, "start": true, "volumes": vols})
	if r.Status != 201 {
		d.t.Fatalf("create %s with volumes: %d %s", id, r.Status, r.Body)
	}
	d.t.Cleanup(func() {
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
	})
}

func (d *daemon) sh(id, script string) execJSON {
	d.t.Helper()
	return d.exec(id, map[string]any{"command": []string{"sh", "-c", script}})
}

func (d *daemon) putVolumeFile(name, p string, body io.Reader) response {
	d.t.Helper()
	h := http.Header{"Content-Type": {"application/octet-stream"}}
	return d.do("PUT", "/v1/volumes/"+name+"/files?path="+p, body, h)
}

// Two running sandboxes mount one volume: each writes a file and reads the other's, both see
// the writer as the sandbox user (1000) whatever host ids their user namespaces map, and the
// API reads both without any sandbox. A read-only mount reads them and cannot write.
func TestVolumeSharedBySandboxes(t *testing.T) {
	d := startVolumeDaemon(t)
	d.createVolume("shared", 64)
	d.createWithVolumes("vol-a", map[string]any{"name": "shared", "path": "/data"})
	d.createWithVolumes("vol-b", map[string]any{"name": "shared", "path": "/home/user/shared"})
	d.createWithVolumes("vol-ro", map[string]any{"name": "shared", "path": "/mnt/ro", "read_only": true})

	if got := d.sh("vol-a", "echo from-a > /data/a && stat -c %u:%g /data/a"); got.ExitCode != 0 || got.Stdout != "1000:1000\n" {
		t.Fatalf("write in vol-a: %+v", got)
	}
	if got := d.sh("vol-b", "echo from-b > ~/shared/b && cat ~/shared/a && stat -c %u:%g ~/shared/a"); got.ExitCode != 0 || got.Stdout != "from-a\n1000:1000\n" {
		t.Fatalf("vol-b reading vol-a's file: %+v", got)
	}
	if got := d.sh("vol-a", "cat /data/b && stat -c %u /data/b"); got.ExitCode != 0 || got.Stdout != "from-b\n1000\n" {
		t.Fatalf("vol-a reading vol-b's file: %+v", got)
	}
	if got := d.sh("vol-ro", "cat /mnt/ro/a /mnt/ro/b; echo x > /mnt/ro/c"); got.ExitCode == 0 || got.Stdout != "from-a\nfrom-b\n" || !strings.Contains(got.Stderr, "Read-only file system") {
		t.Fatalf("the read-only mount: %+v", got)
	}
	r := d.do("GET", "/v1/volumes/shared/files?path=/b", nil, nil)
	if r.Status != 200 || string(r.Body) != "from-b\n" {
		t.Fatalf("API read of vol-b's file: %d %q", r.Status, r.Body)
	}
	// The API's writes are the sandbox user's too.
	if r := d.putVolumeFile("shared", "/dir/from-api", strings.NewReader("api\n")); r.Status != 200 {
		t.Fatalf("API write: %d %s", r.Status, r.Body)
	}
	if got := d.sh("vol-a", "cat /data/dir/from-api && stat -c %u /data/dir /data/dir/from-api"); got.Stdout != "api\n1000\n1000\n" {
		t.Fatalf("the API's file inside: %+v", got)
	}
	ents := decode[struct{ Items []volumeEntryJSON }](t, d.do("GET", "/v1/volumes/shared/files/list?path=/", nil, nil), 200)
	names := map[string]volumeEntryJSON{}
	for _, e := range ents.Items {
		names[e.Name] = e
	}
	if names["a"].UID != 1000 || names["b"].Type != "file" || names["dir"].Type != "directory" {
		t.Fatalf("listing: %+v", ents.Items)
	}

	// In use: not deleted, and the refusal names the sandboxes.
	p := wantProblem(t, d.do("DELETE", "/v1/volumes/shared", nil, nil), 423, "volume-in-use")
	for _, id := range []string{"vol-a", "vol-b", "vol-ro"} {
		if !strings.Contains(p.Detail, id) {
			t.Errorf("the refusal does not name %s: %s", id, p.Detail)
		}
	}
	v := decode[volumeJSON](t, d.do("GET", "/v1/volumes/shared", nil, nil), 200)
	if len(v.Sandboxes) != 3 || v.UsedBytes == 0 {
		t.Fatalf("volume: %+v", v)
	}
	for _, id := range []string{"vol-a", "vol-b", "vol-ro"} {
		d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
		if r := d.doJSON("DELETE", "/v1/sandboxes/"+id, nil); r.Status != 204 {
			t.Fatalf("delete %s: %d %s", id, r.Status, r.Body)
		}
	}
	if r := d.do("DELETE", "/v1/volumes/shared", nil, nil); r.Status != 204 {
		t.Fatalf("delete of a volume no sandbox mounts: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("GET", "/v1/volumes/shared", nil, nil), 404, "volume-not-found")
	// A create naming a volume that does not exist is refused, and leaves no sandbox.
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "vol-none", "volumes": []map[string]any{{"name": "shared", "path": "/data"}}}), 404, "volume-not-found")
	wantProblem(t, d.do("GET", "/v1/sandboxes/vol-none", nil, nil), 404, "sandbox-not-found")
}

// Mount paths are validated before anything is made.
func TestVolumeMountPathsAreValidated(t *testing.T) {
	d := startVolumeDaemon(t)
	d.createVolume("v", 16)
	for _, bad := range []string{"relative", "/", "/proc/x", "/sys", "/dev/shm", "/data/../etc", "/data/", "/run/bothyd"} {
		wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "bad", "volumes": []map[string]any{{"name": "v", "path": bad}}}), 400, "invalid-request")
	}
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "bad", "volumes": []map[string]any{
		{"name": "v", "path": "/data"}, {"name": "v", "path": "/data/inner"}}}), 400, "invalid-request")
	wantProblem(t, d.doJSON("POST", "/v1/volumes", map[string]any{"name": "v"}), 409, "volume-exists")
	wantProblem(t, d.doJSON("POST", "/v1/volumes", map[string]any{"name": "tiny", "size_mb": 1}), 400, "invalid-request")
	// A create with an Idempotency-Key answers a repeat with the first answer, not volume-exists.
	key := http.Header{"Idempotency-Key": {"vol-key-1"}}
	body := `{"name":"once","size_mb":16}`
	first := d.do("POST", "/v1/volumes", strings.NewReader(body), key)
	again := d.do("POST", "/v1/volumes", strings.NewReader(body), key)
	if first.Status != 201 || again.Status != 201 || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("idempotent create: %d, then %d %q", first.Status, again.Status, again.Header.Get("Idempotent-Replayed"))
	}
}

// A volume is as large as it was made: a write through the API past it answers 507
// volume-full and leaves nothing, and one inside a sandbox fails with ENOSPC.
func TestVolumeFullAnswers507(t *testing.T) {
	d := startVolumeDaemon(t)
	d.createVolume("small", 16)
	p := wantProblem(t, d.putVolumeFile("small", "/big", bytes.NewReader(make([]byte, 32<<20))), 507, "volume-full")
	if !strings.Contains(p.Detail, "small") {
		t.Errorf("detail: %s", p.Detail)
	}
	wantProblem(t, d.do("GET", "/v1/volumes/small/files?path=/big", nil, nil), 404, "file-not-found")
	d.createWithVolumes("vol-full", map[string]any{"name": "small", "path": "/data"})
	got := d.sh("vol-full", "dd if=/dev/zero of=/data/f bs=1M count=64 2>&1; echo rc=$?")
	if !strings.Contains(got.Stdout, "No space left on device") || strings.Contains(got.Stdout, "rc=0") {
		t.Fatalf("a write past the volume's size inside: %+v", got)
	}
	// The sandbox files API's write into the mount is the volume's to refuse: 507 volume-full
	// naming it, not storage-full blaming the state root (which would make the server refuse
	// every write until its file system "recovered").
	p = wantProblem(t, d.do("PUT", "/v1/sandboxes/vol-full/files?path=/data/g", bytes.NewReader(make([]byte, 32<<20)), nil), 507, "volume-full")
	if !strings.Contains(p.Detail, "small") {
		t.Errorf("detail: %s", p.Detail)
	}
	// The space is the volume's alone: the sandbox's own disk still takes writes, from inside
	// and through the API.
	if got := d.sh("vol-full", "echo ok > /tmp/x && cat /tmp/x"); got.Stdout != "ok\n" {
		t.Fatalf("the sandbox's own disk: %+v", got)
	}
	if r := d.do("PUT", "/v1/sandboxes/vol-full/files?path=/tmp/y", strings.NewReader("y"), nil); r.Status != 200 && r.Status != 204 {
		t.Fatalf("a write to the sandbox's own disk after the volume filled: %d %s", r.Status, r.Body)
	}
}

// What a sandbox plants in a volume (a link to /etc/shadow, a link to /, a FIFO, a device
// node it cannot make) never steers the API's host-side access out of the volume or into a
// blocking open.
func TestVolumeFilesIgnoreSandboxLinks(t *testing.T) {
	d := startVolumeDaemon(t)
	d.createVolume("planted", 16)
	d.createWithVolumes("vol-hostile", map[string]any{"name": "planted", "path": "/data"})
	if got := d.sh("vol-hostile", "ln -s /etc/shadow /data/shadow && ln -s / /data/root && mkfifo /data/fifo && ln /data/fifo /data/fifo2"); got.ExitCode != 0 {
		t.Fatalf("planting: %+v", got)
	}
	shadow, _ := os.ReadFile("/etc/shadow")
	for _, p := range []string{"/shadow", "/fifo", "/fifo2"} {
		r := d.do("GET", "/v1/volumes/planted/files?path="+p, nil, nil)
		if r.Status != 409 || (len(shadow) > 0 && bytes.Contains(r.Body, shadow[:min(len(shadow), 16)])) {
			t.Fatalf("read of %s: %d %s", p, r.Status, r.Body)
		}
	}
	// Through the link to /: resolved inside the volume, which has no /etc.
	wantProblem(t, d.do("GET", "/v1/volumes/planted/files?path=/root/etc/shadow", nil, nil), 404, "file-not-found")
	// A write at the link replaces the link; the host's file is untouched.
	before, _ := os.ReadFile("/etc/shadow")
	if r := d.putVolumeFile("planted", "/shadow", strings.NewReader("mine")); r.Status != 200 {
		t.Fatalf("write over the link: %d %s", r.Status, r.Body)
	}
	if after, _ := os.ReadFile("/etc/shadow"); !bytes.Equal(before, after) {
		t.Fatal("a write through the volume's link changed the host's /etc/shadow")
	}
	if r := d.putVolumeFile("planted", "/root/etc/passwd", strings.NewReader("x")); r.Status != 200 {
		t.Fatalf("write through the link to /: %d %s", r.Status, r.Body)
	}
	if got := d.sh("vol-hostile", "cat /data/etc/passwd"); got.Stdout != "x" {
		t.Fatalf("the write through the link to / landed in the volume's root: %+v", got)
	}
	ents := decode[struct{ Items []volumeEntryJSON }](t, d.do("GET", "/v1/volumes/planted/files/list?path=/", nil, nil), 200)
	for _, e := range ents.Items {
		if e.Name == "root" && (e.Type != "symlink" || e.Target != "/") {
			t.Fatalf("the link is listed as %+v", e)
		}
	}
	// Remove takes the link, not what it names.
	if r := d.do("DELETE", "/v1/volumes/planted/files?path=/root", nil, nil); r.Status != 204 {
		t.Fatalf("remove of the link: %d %s", r.Status, r.Body)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal(err)
	}
	if r := d.do("POST", "/v1/volumes/planted/files/mkdir?path=/a/b/c", nil, nil); r.Status != 200 {
		t.Fatalf("mkdir: %d %s", r.Status, r.Body)
	}
	wantProblem(t, d.do("DELETE", "/v1/volumes/planted/files?path=/a", nil, nil), 409, "directory-not-empty")
	if r := d.do("DELETE", "/v1/volumes/planted/files?path=/a&recursive=true", nil, nil); r.Status != 204 {
		t.Fatalf("recursive remove: %d %s", r.Status, r.Body)
	}
}

// A server killed with SIGKILL comes back knowing its volumes: the sandbox that mounts one
// still reads and writes it, the hold still refuses the volume's delete, the API still
// reaches its files, and check finds nothing wrong.
func TestVolumeSurvivesServerKill(t *testing.T) {
	d := startVolumeDaemon(t)
	d.createVolume("kept", 32)
	d.createWithVolumes("vol-kept", map[string]any{"name": "kept", "path": "/data"})
	if got := d.sh("vol-kept", "echo before > /data/f"); got.ExitCode != 0 {
		t.Fatalf("%+v", got)
	}
	d.Restart(true)
	if got := d.sh("vol-kept", "cat /data/f && echo after >> /data/f"); got.Stdout != "before\n" {
		t.Fatalf("after the restart, inside: %+v", got)
	}
	if r := d.do("GET", "/v1/volumes/kept/files?path=/f", nil, nil); string(r.Body) != "before\nafter\n" {
		t.Fatalf("after the restart, through the API: %d %q", r.Status, r.Body)
	}
	wantProblem(t, d.do("DELETE", "/v1/volumes/kept", nil, nil), 423, "volume-in-use")
	rep, code, stderr := runCheck(t, d.Root)
	if code != 0 || !rep.OK {
		t.Fatalf("check after the restart: %d %+v %s", code, rep, stderr)
	}
}

// check finds the leftovers a crash can leave (a volume whose create did not finish, with its
// image mounted; a record without its image; a stray mount; a hold of a sandbox that is
// gone) and --repair removes them, leaving the ready volume and its mount alone.
func TestVolumeCheckRepair(t *testing.T) {
	d := startVolumeDaemon(t)
	d.createVolume("good", 16)
	d.createVolume("half", 16)
	d.createVolume("lost", 16)
	d.Stop()
	vdir := filepath.Join(d.Root, "volumes")
	rec := filepath.Join(vdir, "half", "volume.json")
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	v["state"] = "creating"
	b, _ = json.Marshal(v)
	if err := os.WriteFile(rec, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := platform.UnmountUnder(filepath.Join(vdir, "lost")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(vdir, "lost", "disk.img")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vdir, "good", "holds", "gone-sandbox"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(vdir, "stray")
	if err := os.MkdirAll(stray, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := platform.Mount("tmpfs", stray, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	rep, code, _ := runCheck(t, d.Root)
	kinds := map[string]bool{}
	for _, p := range rep.Problems {
		kinds[p.Kind+" "+strings.Split(strings.TrimPrefix(p.Entry, "volumes/"), "/")[0]] = true
	}
	for _, want := range []string{"volume-half-made half", "volume-image-missing lost", "volume-stale-hold good", "volume-leftover-mount stray"} {
		if !kinds[want] {
			t.Errorf("check did not report %s: %+v", want, rep.Problems)
		}
	}
	if code != 1 {
		t.Errorf("check exit %d, want 1", code)
	}
	rep, code, stderr := runCheck(t, d.Root, "--repair")
	if code != 0 || !rep.OK {
		t.Fatalf("repair: %d %+v %s", code, rep, stderr)
	}
	for _, name := range []string{"half", "lost", "stray"} {
		if _, err := os.Lstat(filepath.Join(vdir, name)); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", name, err)
		}
	}
	d.start()
	list := decode[struct{ Items []volumeJSON }](t, d.do("GET", "/v1/volumes", nil, nil), 200)
	if len(list.Items) != 1 || list.Items[0].Name != "good" || len(list.Items[0].Sandboxes) != 0 {
		t.Fatalf("volumes after the repair: %+v", list.Items)
	}
	if r := d.putVolumeFile("good", "/f", strings.NewReader("still")); r.Status != 200 {
		t.Fatalf("the ready volume after the repair: %d %s", r.Status, r.Body)
	}
}

// The CLI makes, lists, inspects and deletes volumes, and mounts them with --volume.
func TestVolumeCLI(t *testing.T) {
	d := startVolumeDaemon(t)
	if out := d.ctlOK("", "volume", "create", "cli-vol", "--size", "32m"); out != "cli-vol\n" {
		t.Fatalf("create: %q", out)
	}
	if out := d.ctlOK("", "create", "cli-box", "--start", "--volume", "cli-vol:/data", "--volume", "cli-vol:/ro:ro"); out != "cli-box\n" {
		t.Fatalf("create with volumes: %q", out)
	}
	t.Cleanup(func() { d.ctl("", "rm", "--force", "cli-box") })
	if got := d.sh("cli-box", "echo hi > /data/f && cat /ro/f && ! touch /ro/g"); got.ExitCode != 0 || got.Stdout != "hi\n" {
		t.Fatalf("the mounts: %+v", got)
	}
	var v volumeJSON
	d.ctlJSON(&v, "volume", "inspect", "cli-vol")
	if v.SizeMB != 32 || len(v.Sandboxes) != 1 || v.Sandboxes[0] != "cli-box" {
		t.Fatalf("inspect: %+v", v)
	}
	if out := d.ctlOK("", "volume", "ls"); !strings.Contains(out, "cli-vol") || !strings.Contains(out, "cli-box") {
		t.Fatalf("ls: %q", out)
	}
	d.wantFail(1, "cli-box", "volume", "rm", "cli-vol")
	d.ctlOK("", "rm", "--force", "cli-box")
	if out := d.ctlOK("", "volume", "rm", "cli-vol"); out != "cli-vol\n" {
		t.Fatalf("rm: %q", out)
	}
	d.wantFail(2, "not NAME:/PATH", "create", "x", "--volume", "nopath")
}

// A capture holds none of a volume's files (the volume is a mount of its own, not in the
// writable layer), and a clone mounts the volumes its own create names, or none.
func TestVolumeTemplates(t *testing.T) {
	d := startVolumeDaemon(t)
	d.createVolume("tpl-data", 64)
	d.createVolume("tpl-other", 16)
	d.createWithVolumes("tpl-src", map[string]any{"name": "tpl-data", "path": "/data"})
	if got := d.sh("tpl-src", "head -c 8388608 /dev/zero > /data/big && echo own > /home/user/own && sync"); got.ExitCode != 0 {
		t.Fatalf("%+v", got)
	}
	if r := d.doJSON("POST", "/v1/sandboxes/tpl-src/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Body)
	}
	if r := d.doJSON("POST", "/v1/templates", map[string]any{"name": "tpl"}); r.Status != 201 {
		t.Fatalf("template: %d %s", r.Status, r.Body)
	}
	g := decode[generationJSON](t, d.doJSON("POST", "/v1/templates/tpl/generations", map[string]any{"sandbox": "tpl-src"}), 201)
	if g.SizeBytes >= 8<<20 {
		t.Fatalf("the generation holds %d bytes: the volume's 8 MiB file was copied", g.SizeBytes)
	}
	clone := func(id string, vols ...map[string]any) {
		body := map[string]any{"id": id, "template": "tpl", "start": true}
		if len(vols) > 0 {
			body["volumes"] = vols
		}
		r := d.doJSON("POST", "/v1/sandboxes", body)
		if r.Status != 201 {
			t.Fatalf("clone %s: %d %s", id, r.Status, r.Body)
		}
		t.Cleanup(func() {
			d.doJSON("POST", "/v1/sandboxes/"+id+"/stop?force=true", nil)
			d.doJSON("DELETE", "/v1/sandboxes/"+id, nil)
		})
	}
	clone("tpl-bare")
	if got := d.sh("tpl-bare", "cat /home/user/own; ls -A /data 2>/dev/null | wc -l"); got.Stdout != "own\n0\n" {
		t.Fatalf("a clone without volumes: %+v", got)
	}
	clone("tpl-other-clone", map[string]any{"name": "tpl-other", "path": "/data"})
	if got := d.sh("tpl-other-clone", "test -e /data/big; echo $?; echo mine > /data/m"); got.Stdout != "1\n" {
		t.Fatalf("a clone with another volume at the same path: %+v", got)
	}
	clone("tpl-same", map[string]any{"name": "tpl-data", "path": "/data"})
	if got := d.sh("tpl-same", "stat -c %s /data/big"); got.Stdout != "8388608\n" {
		t.Fatalf("a clone naming the source's volume: %+v", got)
	}
	v := decode[volumeJSON](t, d.do("GET", "/v1/volumes/tpl-data", nil, nil), 200)
	if strings.Join(v.Sandboxes, ",") != "tpl-same,tpl-src" {
		t.Fatalf("the holders of tpl-data: %v", v.Sandboxes)
	}
}
