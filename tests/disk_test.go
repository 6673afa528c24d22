package tests

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace"
)

// disksUnsupported says why sandboxes cannot have disks of their own on this host (the
// runtime's own DiskSupport: no loop devices, or no mke2fs), or "" if they can: bothyd
// then answers such a create 503.
func disksUnsupported() string {
	rt, err := namespace.New(namespace.Config{})
	if err == nil {
		err = rt.DiskSupport()
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// disksSupported is disksUnsupported() == "", looked up once.
var disksSupported = sync.OnceValue(func() bool { return disksUnsupported() == "" })

// requireLoopDevices skips a test of sandboxes' own disks on a host that cannot give them.
func requireLoopDevices(t *testing.T) {
	t.Helper()
	if why := disksUnsupported(); why != "" {
		t.Skipf("%s here: sandboxes cannot have disks of their own", why)
	}
}

// attachedImages lists the host's loop devices whose backing file is a disk image of this
// daemon's sandboxes, by sandbox id.
func (d *daemon) attachedImages() map[string]int {
	d.t.Helper()
	files, err := platform.LoopBackingFiles()
	if err != nil {
		d.t.Fatal(err)
	}
	out := map[string]int{}
	for _, f := range files {
		f = strings.TrimSuffix(f, " (deleted)") // the image of a deleted sandbox
		if rest, ok := strings.CutPrefix(f, filepath.Join(d.Root, "sandboxes")+"/"); ok {
			if id, ok := strings.CutSuffix(rest, "/disk.img"); ok {
				out[id]++
			}
		}
	}
	return out
}

// mustLoopFiles lists the backing files of the host's loop devices.
func mustLoopFiles(t *testing.T) map[string]string {
	t.Helper()
	files, err := platform.LoopBackingFiles()
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// diskMiB is the size of the file system at / inside the sandbox, in MiB.
func (d *daemon) diskMiB(id string) int {
	d.t.Helper()
	got := d.exec(id, map[string]any{"command": []string{"sh", "-c", "df -k / | tail -1 | awk '{print $2}'"}})
	kib, err := strconv.Atoi(strings.TrimSpace(got.Stdout))
	if err != nil {
		d.t.Fatalf("df in %s: %+v", id, got)
	}
	return kib >> 10
}

// TestDiskOfItsOwn: a sandbox created with resources.disk_mb writes to a disk of that size,
// which keeps its files across a stop and a start; its loop device is attached only while it
// runs (or is captured), however it ends; its capture clones like any other, and a clone gets
// a disk of its own. Bounds are refused; a server default applies to creates that name none.
func TestDiskOfItsOwn(t *testing.T) {
	requireRoot(t)
	requireLoopDevices(t)
	t.Parallel()
	d := startDaemon(t)

	var sb struct {
		Resources struct {
			DiskMB int `json:"disk_mb"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "dk", "start": true, "resources": map[string]any{"disk_mb": 64}}).Body, &sb); err != nil || sb.Resources.DiskMB != 64 {
		t.Fatalf("created with disk_mb 64, it reads %+v (%v)", sb, err)
	}
	if n := d.attachedImages()["dk"]; n != 1 {
		t.Fatalf("%d loop devices hold dk's disk while it runs, want 1", n)
	}
	// ext4 keeps some of the disk for itself; what is left is near the size asked for.
	if got := d.diskMiB("dk"); got > 64 || got < 48 {
		t.Fatalf("the sandbox's / is %d MiB, want about 64", got)
	}
	if got := d.exec("dk", map[string]any{"command": []string{"sh", "-c", "echo kept > /home/user/kept"}}); got.ExitCode != 0 {
		t.Fatalf("write: %+v", got)
	}
	// Captured while it runs: from a snapshot of its disk, taken while it is frozen and let
	// go after the copy; the sandbox runs on, on its one device.
	d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": "dklive"})
	var live struct {
		CapturePauseMS int64 `json:"capture_pause_ms"`
	}
	if err := json.Unmarshal(d.mustStatus(201, "POST", "/v1/templates/dklive/generations", map[string]any{"sandbox": "dk"}).Body, &live); err != nil || live.CapturePauseMS < 1 {
		t.Fatalf("the capture of a running sandbox with a disk of its own: %+v (%v)", live, err)
	}
	if got := d.exec("dk", map[string]any{"command": []string{"cat", "/home/user/kept"}}); got.Stdout != "kept\n" {
		t.Fatalf("after its capture while running: %+v", got)
	}
	waitFor(t, 20*time.Second, "the snapshot's loop device to be released", func() bool {
		n := 0
		for _, f := range mustLoopFiles(t) {
			if strings.HasPrefix(f, filepath.Join(d.Root, "sandboxes", "dk")+"/") {
				n++
			}
		}
		return n == 1
	})
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "dklivecopy", "template": "dklive", "start": true})
	if got := d.exec("dklivecopy", map[string]any{"command": []string{"cat", "/home/user/kept"}}); got.Stdout != "kept\n" {
		t.Fatalf("a clone of the running disk sandbox's generation: %+v", got)
	}
	d.dispose("dklivecopy")

	released := func(how string) {
		t.Helper()
		waitFor(t, 20*time.Second, "dk's loop device to be released after "+how, func() bool {
			return d.attachedImages()["dk"] == 0
		})
	}
	d.mustStatus(200, "POST", "/v1/sandboxes/dk/stop", nil)
	released("a stop")
	d.mustStatus(200, "POST", "/v1/sandboxes/dk/start", nil)
	if got := d.exec("dk", map[string]any{"command": []string{"cat", "/home/user/kept"}}); got.Stdout != "kept\n" {
		t.Fatalf("after a stop and a start: %+v", got)
	}
	// Killed from the host, as the OOM killer or a crash would: its mount namespace goes
	// with it, and the device with the mount.
	d.killInit("dk")
	released("its init was killed")
	waitFor(t, 20*time.Second, "dk to read as stopped", func() bool {
		var st sandboxJSON
		return json.Unmarshal(d.do("GET", "/v1/sandboxes/dk", nil, nil).Body, &st) == nil && st.State == "stopped"
	})

	// Captured from its disk (mounted for the copy on the side, then let go), and cloned.
	d.mustStatus(201, "POST", "/v1/templates", map[string]any{"name": "dkt"})
	d.mustStatus(201, "POST", "/v1/templates/dkt/generations", map[string]any{"sandbox": "dk"})
	released("a capture")
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "dkcopy", "template": "dkt", "start": true})
	t.Cleanup(func() { d.dispose("dkcopy") })
	if got := d.exec("dkcopy", map[string]any{"command": []string{"cat", "/home/user/kept"}}); got.Stdout != "kept\n" {
		t.Fatalf("a clone of the disk sandbox's generation: %+v", got)
	}

	// A clone gets a disk of its own too.
	d.buildTemplate("dkbase")
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "dkclone", "template": "dkbase", "start": true, "resources": map[string]any{"disk_mb": 48}})
	t.Cleanup(func() { d.dispose("dkclone") })
	if got := d.diskMiB("dkclone"); got > 48 || got < 32 {
		t.Fatalf("the clone's / is %d MiB, want about 48", got)
	}
	if got := d.exec("dkclone", map[string]any{"command": []string{"/opt/tool/run", "hi"}}); got.Stdout != "tool says hi\n" {
		t.Fatalf("the clone does not see its generation: %+v", got)
	}

	// Bounds, and the server's limits.
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"resources": map[string]any{"disk_mb": 16}}), 400, "invalid-request")
	wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"resources": map[string]any{"disk_mb": 1 << 21}}), 400, "invalid-request")
	var info struct {
		Limits struct {
			DefaultResources struct {
				DiskMB int `json:"disk_mb"`
			} `json:"default_resources"`
			MaxResources struct {
				DiskMB int `json:"disk_mb"`
			} `json:"max_resources"`
		} `json:"limits"`
	}
	if err := json.Unmarshal(d.mustStatus(200, "GET", "/v1/info", nil).Body, &info); err != nil || info.Limits.DefaultResources.DiskMB != 1024 || info.Limits.MaxResources.DiskMB != 1<<20 {
		t.Fatalf("info limits %+v (%v)", info.Limits, err)
	}

	// Deleted: nothing of its disk is left.
	d.mustStatus(204, "DELETE", "/v1/sandboxes/dk", nil)
	if n := d.attachedImages()["dk"]; n != 0 {
		t.Fatalf("%d loop devices hold dk's disk after its deletion", n)
	}

	// A server default applies to a create that names no disk.
	d2 := startDaemon(t, withArgs("--default-disk-mb", "40"))
	d2.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": "dflt", "start": true})
	t.Cleanup(func() { d2.dispose("dflt") })
	if got := d2.diskMiB("dflt"); got > 40 || got < 24 {
		t.Fatalf("with --default-disk-mb 40, / is %d MiB", got)
	}
}

// What a sandbox's log says of its release: the report, whoever released, and the shim's
// line when it had to start a releaser process.
const (
	releasedLine    = " bothyd releaser: released the sandbox's root in "
	releaserStarted = "a releaser takes it"
)

// startDiskSandbox creates and starts the sandbox id on d with a 64 MiB disk of its own,
// disposed of when the test ends.
func startDiskSandbox(t *testing.T, d *daemon, id string) {
	t.Helper()
	d.mustStatus(201, "POST", "/v1/sandboxes", map[string]any{"id": id, "start": true, "resources": map[string]any{"disk_mb": 64}})
	t.Cleanup(func() { d.dispose(id) })
}

// TestDiskReleasedBehindTheStop: a stop does not wait for the kernel to shut the sandbox's
// root and disk down. The shim hands that to bothyd once it has reported the end, so the
// release's report comes after the outcome's time; the disk's loop device then goes. The
// next start of the sandbox waits for the disk's lock, which a launch and then its releaser
// hold: with the lock held here, as a releaser would hold it, the start waits and says so in
// the sandbox's log, and it runs once the lock is let go, with the files the sandbox wrote.
func TestDiskReleasedBehindTheStop(t *testing.T) {
	requireRoot(t)
	requireLoopDevices(t)
	t.Parallel()
	d := startDaemon(t)
	startDiskSandbox(t, d, "rel")
	// Data left unwritten, for the release to write back.
	sum := d.exec("rel", map[string]any{"command": []string{"sh", "-c", "head -c 16777216 /dev/urandom > /home/user/data && md5sum /home/user/data"}})
	if sum.ExitCode != 0 || len(sum.Stdout) < 32 {
		t.Fatalf("write: %+v", sum)
	}
	var stopped struct {
		LastExit struct {
			At time.Time `json:"at"`
		} `json:"last_exit"`
	}
	if err := json.Unmarshal(d.mustStatus(200, "POST", "/v1/sandboxes/rel/stop?force=true", nil).Body, &stopped); err != nil || stopped.LastExit.At.IsZero() {
		t.Fatalf("the stop's answer has no last_exit.at (%v)", err)
	}
	logPath := filepath.Join(d.Root, "sandboxes", "rel", "sandbox.log")
	var releasedAt time.Time
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("rel's sandbox.log:\n%s", b)
		}
	})
	waitFor(t, 30*time.Second, "the releaser's report in the sandbox's log", func() bool {
		b, _ := os.ReadFile(logPath)
		for line := range strings.Lines(string(b)) {
			if stamp, _, ok := strings.Cut(line, releasedLine); ok {
				at, err := time.Parse(time.RFC3339Nano, stamp)
				if err != nil {
					t.Fatalf("the releaser's line %q: %v", line, err)
				}
				releasedAt = at
			}
		}
		return !releasedAt.IsZero()
	})
	if releasedAt.Before(stopped.LastExit.At) {
		t.Fatalf("the release ended at %v, before the launch's end was reported (%v)", releasedAt, stopped.LastExit.At)
	}
	// bothyd took the release: the shim started no releaser.
	if b, _ := os.ReadFile(logPath); strings.Contains(string(b), releaserStarted) {
		t.Fatalf("the shim did not hand the release to bothyd:\n%s", b)
	}
	waitFor(t, 20*time.Second, "rel's loop device to be released", func() bool { return d.attachedImages()["rel"] == 0 })

	// The disk's lock, held as a releaser holds it.
	lock, err := platform.OpenFile(filepath.Join(d.Root, "sandboxes", "rel", "disk.img"), os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if ok, err := platform.TryLock(lock); !ok || err != nil {
		t.Fatalf("the disk's lock is not free after the release: %v, %v", ok, err)
	}
	started := make(chan int, 1)
	go func() {
		req, err := http.NewRequest("POST", d.URL+"/v1/sandboxes/rel/start", nil)
		if err != nil {
			started <- -1
			return
		}
		req.Header.Set("Authorization", "Bearer "+d.Token)
		resp, err := d.httpClient().Do(req)
		if err != nil {
			started <- -1
			return
		}
		resp.Body.Close()
		started <- resp.StatusCode
	}()
	waitFor(t, 30*time.Second, "the start to wait for the disk's lock", func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Count(string(b), "waiting for the release of the disk by an earlier launch") == 1
	})
	select {
	case code := <-started:
		t.Fatalf("the start answered %d while the disk's lock was held", code)
	default:
	}
	var st sandboxJSON
	if err := json.Unmarshal(d.do("GET", "/v1/sandboxes/rel", nil, nil).Body, &st); err != nil || st.State == "running" {
		t.Fatalf("rel reads %+v (%v) while its start waits for the disk", st, err)
	}
	lock.Close()
	if code := <-started; code != 200 {
		t.Fatalf("the start answered %d once the disk's lock was let go, want 200", code)
	}
	if got := d.exec("rel", map[string]any{"command": []string{"md5sum", "/home/user/data"}}); got.Stdout != sum.Stdout {
		t.Fatalf("after the release and the start: %+v, want %q", got, sum.Stdout)
	}
}

// TestReleaseWithoutBothyd: a sandbox that ends while bothyd is down (its init killed
// here) is released by a releaser process, since nothing answers on the release socket; the
// restarted bothyd finds it stopped and starts it again on its disk.
func TestReleaseWithoutBothyd(t *testing.T) {
	requireRoot(t)
	requireLoopDevices(t)
	t.Parallel()
	d := startDaemon(t)
	startDiskSandbox(t, d, "orphan")
	if got := d.exec("orphan", map[string]any{"command": []string{"sh", "-c", "echo kept > /home/user/f"}}); got.ExitCode != 0 {
		t.Fatalf("write: %+v", got)
	}
	rt, err := namespace.New(namespace.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d.Kill()
	procs, err := rt.Processes(d.Root)
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, p := range procs {
		if p.Role == runtime.RoleInit && strings.HasSuffix(p.Dir, "/orphan") {
			if err := platform.SignalVerified(p.ID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("killed %d inits of orphan, want 1 (%+v)", killed, procs)
	}
	logPath := filepath.Join(d.Root, "sandboxes", "orphan", "sandbox.log")
	waitFor(t, 30*time.Second, "a releaser's report in orphan's log", func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), releaserStarted) && strings.Contains(string(b), releasedLine)
	})
	d.start()
	waitFor(t, 30*time.Second, "orphan to read as stopped", func() bool {
		var st sandboxJSON
		return json.Unmarshal(d.do("GET", "/v1/sandboxes/orphan", nil, nil).Body, &st) == nil && st.State == "stopped"
	})
	d.mustStatus(200, "POST", "/v1/sandboxes/orphan/start", nil)
	if got := d.exec("orphan", map[string]any{"command": []string{"cat", "/home/user/f"}}); got.Stdout != "kept\n" {
		t.Fatalf("after the releaser and a start: %+v", got)
	}
}
