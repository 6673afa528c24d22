package tests

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// uidMap is /proc/self/uid_map as a process in sandbox id sees it, its fields joined by one
// space: "0 0 4294967295" is the host's own (no user namespace).
func (d *daemon) uidMap(id string) string {
	d.t.Helper()
	got := decode[execJSON](d.t, d.doJSON("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"command": []string{"cat", "/proc/self/uid_map"}}), 200)
	if got.ExitCode != 0 {
		d.t.Fatalf("cat /proc/self/uid_map: %+v", got)
	}
	return strings.Join(strings.Fields(got.Stdout), " ")
}

// hostUIDMap is the uid map of a process without a user namespace of its own.
const hostUIDMap = "0 0 4294967295"

// TestUserNamespacesOff: on a state root that cannot be idmapped (overlayfs, as inside a
// container's root file system), bothyd's start-up probe finds so: /v1/info lists the
// namespace runtime unavailable and a create is refused at once (503 unavailable, where it
// was a 504 start-timeout after the fact), naming the kernel and --user-namespaces=false;
// with that flag the same root starts sandboxes, with the host's ids, and `bothyd check`
// given the flag finds it consistent. A default root runs sandboxes in a user namespace.
func TestUserNamespacesOff(t *testing.T) {
	requireRoot(t)
	t.Parallel()

	def := startDaemon(t)
	def.create("own", true)
	if m := def.uidMap("own"); m == hostUIDMap || !strings.HasPrefix(m, "0 ") {
		t.Fatalf("a default sandbox's uid map is %q, want a range of its own", m)
	}

	dir := t.TempDir()
	for _, sub := range []string{"lower", "upper", "work", "mnt"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mnt := filepath.Join(dir, "mnt")
	opts := "lowerdir=" + filepath.Join(dir, "lower") + ",upperdir=" + filepath.Join(dir, "upper") + ",workdir=" + filepath.Join(dir, "work")
	if err := syscall.Mount("overlay", mnt, "overlay", 0, opts); err != nil {
		t.Skipf("no overlayfs to put a state root on: %v", err)
	}
	// Registered before the daemon's cleanup, so it runs after it (and after the reaping).
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting the overlay: %v", err)
		}
	})
	d := startDaemon(t, func(d *daemon) { d.Root = filepath.Join(mnt, "root") })
	p := wantProblem(t, d.doJSON("POST", "/v1/sandboxes", map[string]any{"id": "ov", "start": true}), 503, "unavailable")
	for _, part := range []string{"idmapped", "--user-namespaces=false", "Linux "} {
		if !strings.Contains(p.Detail, part) {
			t.Fatalf("the refusal on overlayfs does not say %q: %s", part, p.Detail)
		}
	}
	if st := d.runtimeStatus("namespace"); st.State != "unavailable" || !strings.Contains(st.Reason, "--user-namespaces=false") {
		t.Fatalf("/v1/info shows the namespace runtime as %+v", st)
	}

	d.Args = append(d.Args, "--user-namespaces=false")
	d.Restart(false)
	d.create("ov", true)
	if m := d.uidMap("ov"); m != hostUIDMap {
		t.Fatalf("with --user-namespaces=false the uid map is %q, want the host's %q", m, hostUIDMap)
	}
	if r, code, stderr := runCheck(t, d.Root, "--user-namespaces=false"); code != 0 || !r.OK || r.Running != 1 {
		t.Fatalf("bothyd check --user-namespaces=false exited %d: %+v %s", code, r, stderr)
	}
}
