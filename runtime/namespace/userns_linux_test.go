//go:build linux

package namespace

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bothy/bothy/platform"
	"github.com/bothy/bothy/runtime"
	"github.com/bothy/bothy/runtime/namespace/shim"
)

// idRangeOf returns the first host id of the sandbox's user namespace, read from its init's
// uid_map and gid_map on the host, which must map 0-65535 and nothing else.
func (s *sandbox) idRangeOf(tb testing.TB) uint32 {
	tb.Helper()
	init := s.initOf(tb)
	var base uint32
	for _, m := range []string{"uid_map", "gid_map"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", init.Pid, m))
		if err != nil {
			tb.Fatal(err)
		}
		f := strings.Fields(string(b))
		if len(f) != 3 || f[0] != "0" || f[2] != strconv.Itoa(shim.IDRangeSize) {
			tb.Fatalf("%s of the init is %q, want 0 <host id> %d", m, b, shim.IDRangeSize)
		}
		n, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			tb.Fatal(err)
		}
		if m == "gid_map" && uint32(n) != base {
			tb.Fatalf("gid_map starts at %d, uid_map at %d", n, base)
		}
		base = uint32(n)
	}
	if base < DefaultIDBase || (base-DefaultIDBase)%shim.IDRangeSize != 0 {
		tb.Fatalf("the range starts at host id %d, not at a slot of %d", base, DefaultIDBase)
	}
	return base
}

// hostIDs returns the real, effective, saved and file system user ids of pid on the host.
func hostIDs(tb testing.TB, pid int) []string {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(rest)
		}
	}
	tb.Fatalf("no Uid line for %d", pid)
	return nil
}

// nsOwner returns the host uid that owns the user namespace of pid (NS_GET_OWNER_UID).
func nsOwner(tb testing.TB, pid int) uint32 {
	tb.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var uid uint32
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.NS_GET_OWNER_UID, uintptr(unsafe.Pointer(&uid))); errno != 0 {
		tb.Fatal(errno)
	}
	return uid
}

// TestUserNamespaceIDs: the sandbox runs in a user namespace whose ids are a range of
// unprivileged host ids: its root (the agent) is the range's first id on the host, a
// workload of "user" is that plus 1000, and the namespace's owner, against whom the kernel
// counts what the sandbox holds in the host's namespace, is the range's first id, not host
// root. Without the user namespace, the init's host uid was 0.
func TestUserNamespaceIDs(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "ids", runtime.Resources{})
	base := s.idRangeOf(t)
	init := s.initOf(t)
	want := strconv.FormatUint(uint64(base), 10)
	if ids := hostIDs(t, init.Pid); strings.Join(ids, " ") != strings.Repeat(want+" ", 3)+want {
		t.Fatalf("the init's host uids are %v, want %s for all", ids, want)
	}
	if owner := nsOwner(t, init.Pid); owner != base {
		t.Fatalf("the user namespace is owned by host uid %d, want %d", owner, base)
	}
	if r := s.sh(t, "user", "sleep 300 & echo started"); r.Code != 0 {
		t.Fatalf("start sleep: %+v", r)
	}
	pids, err := s.cgroup(t).Pids()
	if err != nil {
		t.Fatal(err)
	}
	userID := strconv.FormatUint(uint64(base)+1000, 10)
	found := false
	for _, pid := range pids {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(b)) == "sleep" {
			found = true
			if ids := hostIDs(t, pid); ids[0] != userID || ids[1] != userID {
				t.Fatalf("a workload of user runs as host uids %v, want %s", ids, userID)
			}
		}
	}
	if !found {
		t.Fatalf("no sleep among the sandbox's processes %v", pids)
	}
	r := s.sh(t, "root", "id -u; id -g; cat /proc/self/uid_map")
	if f := strings.Fields(r.Output); r.Code != 0 || len(f) != 5 || f[0] != "0" || f[1] != "0" || f[2] != "0" || f[3] != want {
		t.Fatalf("inside, root sees %+v", r)
	}
}

// TestUserNamespaceOwnership: ownership inside is the layers' own (sandbox-relative) ids: the
// host image's files and the host's /usr are root's, /home/user is the user's, a file in a
// lower layer owned by 1000 on disk is 1000 inside; what the sandbox writes lands on disk
// under its inside ids, whiteouts and opaque directories in the format a capture expects.
func TestUserNamespaceOwnership(t *testing.T) {
	checkOwnership(t, newTestRuntime(t))
}

// checkOwnership is TestUserNamespaceOwnership with the runtime rt.
func checkOwnership(t *testing.T, rt *Runtime) {
	t.Helper()
	root := newStateRoot(t)
	lower := filepath.Join(root, "lower")
	if err := os.MkdirAll(filepath.Join(lower, "opt/owned"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "opt/owned/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"opt/owned", "opt/owned/f"} {
		if err := os.Chown(filepath.Join(lower, p), 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	s := startSpec(t, rt, root, "owner", func(sp *runtime.Spec) { sp.Lowers = []string{lower} })
	// /etc and /etc/hostname are the host files' layer's, a tmpfs (the uppermost lower with
	// an /etc gives the directory its owner).
	r := s.sh(t, "root", "stat -c '%n %u:%g' /etc /etc/hostname /etc/passwd /usr/bin/env /home/user /opt/owned/f /tmp /dev/pts/ptmx")
	want := "/etc 0:0\n/etc/hostname 0:0\n/etc/passwd 0:0\n/usr/bin/env 0:0\n/home/user 1000:1000\n/opt/owned/f 1000:1000\n/tmp 0:0\n/dev/pts/ptmx 0:0\n"
	if r.Code != 0 || r.Output != want {
		t.Fatalf("ownership inside:\n%s\nwant:\n%s", r.Output, want)
	}
	if r := s.sh(t, "user", "echo u > /home/user/mine && echo more >> /opt/owned/f"); r.Code != 0 {
		t.Fatalf("user writes: %+v", r)
	}
	if r := s.sh(t, "root", "touch /rootfile && rm /etc/os-release && rm -rf /home/user/.profile /opt/owned && mkdir /opt/owned"); r.Code != 0 {
		t.Fatalf("root writes: %+v", r)
	}
	s.shutdown(t)
	s.waitShimGone(t)
	upper := filepath.Join(s.spec.Dir, shim.EntryUpper)
	for p, w := range map[string]uint32{"home/user/mine": 1000, "rootfile": 0, "opt/owned": 0} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, p), &st); err != nil || st.Uid != w || st.Gid != w {
			t.Fatalf("upper/%s is owned by %d:%d (%v), want %d:%d", p, st.Uid, st.Gid, err, w, w)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "etc/os-release"), &st); err != nil ||
		st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 || st.Uid != 0 {
		t.Fatalf("the removed lower file is no 0/0 whiteout of root's: mode %o rdev %d uid %d (%v)", st.Mode, st.Rdev, st.Uid, err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(upper, "opt/owned"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("the recreated directory is not opaque (trusted.overlay.opaque %q, %v)", buf[:n], err)
	}
}

// startSpec is startSandbox with the spec changed by edit.
func startSpec(tb testing.TB, rt *Runtime, root, name string, edit func(*runtime.Spec)) *sandbox {
	tb.Helper()
	sandboxSeq++
	id := fmt.Sprintf("%s-%d-%d", name, os.Getpid(), sandboxSeq)
	dir := filepath.Join(root, "sandboxes", id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	spec := runtime.Spec{ID: id, Dir: dir, LaunchID: "launch-" + id, Image: "host", Capability: []byte("secret-" + id)}
	edit(&spec)
	pid, err := rt.Start(context.Background(), spec)
	if err != nil {
		tb.Fatal(err)
	}
	s := &sandbox{rt: rt, spec: spec, id: pid}
	tb.Cleanup(func() { s.destroy(tb) })
	if err := s.waitReady(15 * time.Second); err != nil {
		tb.Fatal(err)
	}
	return s
}

// TestUserNamespaceDiskOwnership: on a disk of the sandbox's own too, the user's files are
// 1000's on disk, as a capture reads them.
func TestUserNamespaceDiskOwnership(t *testing.T) {
	checkDiskOwnership(t, newTestRuntime(t))
}

// checkDiskOwnership is TestUserNamespaceDiskOwnership with the runtime rt.
func checkDiskOwnership(t *testing.T, rt *Runtime) {
	t.Helper()
	if err := rt.DiskSupport(); err != nil {
		t.Skipf("no disk support here: %v", err)
	}
	root := newStateRoot(t)
	s := startSpec(t, rt, root, "diskown", func(sp *runtime.Spec) { sp.DiskMB = 64 })
	if r := s.sh(t, "user", "echo u > /home/user/mine && stat -c %u:%g /home/user/mine /"); r.Code != 0 || r.Output != "1000:1000\n0:0\n" {
		t.Fatalf("on its own disk: %+v", r)
	}
	s.shutdown(t)
	s.waitShimGone(t)
	layer, err := rt.OpenLayer(s.spec.Dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer layer.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(layer.Fd()), "home/user/mine", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Uid != 1000 || st.Gid != 1000 {
		t.Fatalf("the user's file on the disk is %d:%d (%v), want 1000:1000", st.Uid, st.Gid, err)
	}
}

// TestUserNamespaceNproc is the probe of issue 12: host processes of uid 1000 do not count
// against the fork budget (RLIMIT_NPROC) of the sandbox's user 1000. Without the user
// namespace, three host processes of uid 1000 made a limit of 4 refuse a fork inside a
// sandbox that ran two tasks.
func TestUserNamespaceNproc(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	for range 3 {
		cmd := exec.Command("sleep", "300")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	s := startSandbox(t, rt, root, "nproc", runtime.Resources{})
	r := s.sh(t, "user", `exec bash -c 'ulimit -u 4; sleep 30 & sleep 30 & if /bin/true; then echo forked; fi; kill %1 %2'`)
	if r.Code != 0 || !strings.Contains(r.Output, "forked") {
		t.Fatalf("a fork within the sandbox's own budget was refused: %+v", r)
	}
}

// TestNoNestedUserNamespaces: no process of the sandbox, root included, makes a user
// namespace; the namespace's limit is 0.
func TestNoNestedUserNamespaces(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	s := startSandbox(t, rt, root, "nested", runtime.Resources{})
	if r := s.sh(t, "root", "cat /proc/sys/user/max_user_namespaces"); r.Code != 0 || r.Output != "0\n" {
		t.Fatalf("max_user_namespaces inside: %+v", r)
	}
	for _, user := range []string{"root", "user"} {
		if r := s.sh(t, user, "unshare -U -r true && echo made"); r.Code == 0 || strings.Contains(r.Output, "made") {
			t.Fatalf("%s made a user namespace: %+v", user, r)
		}
	}
}

// slotOf returns the registry slot of the range that starts at base.
func slotOf(base uint32) int { return int(base-DefaultIDBase) / shim.IDRangeSize }

// slotHeld reports whether some process holds the slot in the default registry.
func slotHeld(tb testing.TB, slot int) bool {
	tb.Helper()
	reg, err := platform.OpenIDRangeLock(DefaultIDRegistry)
	if err != nil {
		tb.Fatal(err)
	}
	defer reg.Close()
	held, err := reg.Held(slot)
	if err != nil {
		tb.Fatal(err)
	}
	return held
}

// TestIDRangesApartAndReleased: running sandboxes never share a range; a range is held while
// its sandbox runs and free once it ends, by a stop, by a kill of its init, or by a SIGKILL of
// its shim (nothing to reclaim afterwards).
func TestIDRangesApartAndReleased(t *testing.T) {
	rt := newTestRuntime(t)
	root := newStateRoot(t)
	var boxes []*sandbox
	seen := map[uint32]string{}
	for i := range 3 {
		s := startSandbox(t, rt, root, fmt.Sprintf("apart%d", i), runtime.Resources{})
		base := s.idRangeOf(t)
		if other, ok := seen[base]; ok {
			t.Fatalf("%s and %s share the range from %d", other, s.spec.ID, base)
		}
		seen[base] = s.spec.ID
		if !slotHeld(t, slotOf(base)) {
			t.Fatalf("the slot of %s's range is not held while it runs", s.spec.ID)
		}
		boxes = append(boxes, s)
	}
	ends := []func(s *sandbox){
		func(s *sandbox) { s.shutdown(t) },
		func(s *sandbox) {
			if err := platform.SignalVerified(s.initOf(t), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
		func(s *sandbox) {
			if err := platform.SignalVerified(s.id, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
	}
	for i, s := range boxes {
		slot := slotOf(s.idRangeOf(t))
		ends[i](s)
		s.waitShimGone(t)
		// The slot goes with the last holder of its lock's file description: after a SIGKILL
		// of the shim, that may be its init for the moment its parent-death signal takes.
		deadline := time.Now().Add(10 * time.Second)
		for slotHeld(t, slot) {
			if time.Now().After(deadline) {
				t.Fatalf("the slot of %s is still held after its end %d", s.spec.ID, i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
