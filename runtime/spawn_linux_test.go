package runtime

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/platform"
)

// threads is this process's thread count.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := bytes.Cut(b, []byte("\nThreads:"))
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	n, err := strconv.Atoi(string(bytes.TrimSpace(line)))
	if err != nil {
		t.Fatalf("Threads of /proc/self/status: %v", err)
	}
	return n
}

// Runtime processes are reaped without an OS thread each: a server with thousands of running
// sandboxes would otherwise hold thousands of threads, each a host pid.
func TestSpawnDetachedReapsWithoutAThreadEach(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	log, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	const n = 40
	before := threads(t)
	var ids []platform.ProcessID
	defer func() {
		for _, id := range ids {
			_ = platform.SignalVerified(id, syscall.SIGKILL)
		}
	}()
	for range n {
		// The configuration is read, then the process waits until it is killed.
		id, err := SpawnDetached("test", "/bin/sh", []string{"-c", "cat <&3 >/dev/null; exec sleep 60"}, log, []byte("{}"), "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Give blocked waits time to take their threads, as cmd.Wait in a goroutine would.
	deadline := time.Now().Add(time.Second)
	grown := 0
	for time.Now().Before(deadline) {
		grown = threads(t) - before
		if grown >= n/2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if grown >= n/2 {
		t.Fatalf("%d running runtime processes made %d more threads: a thread is blocked per process", n, grown)
	}
	for _, id := range ids {
		if err := platform.SignalVerified(id, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	// Each is reaped: its /proc entry goes (a zombie keeps it).
	deadline = time.Now().Add(10 * time.Second)
	for _, id := range ids {
		for {
			if _, err := os.Stat("/proc/" + strconv.Itoa(id.Pid)); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d was not reaped", id.Pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// On cgroup v2 a runtime process starts in the leaf <parent>/runtime, made if missing, not in
// bothyd's cgroup (a restart of bothyd's systemd unit would kill it there); on v1 it stays
// where bothyd is.
func TestSpawnDetachedIntoRuntimeCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups); CI runs as root")
	}
	v, err := platform.CgroupVersion()
	if err != nil {
		t.Skipf("no usable cgroup hierarchy: %v", err)
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	log, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	parent := "bothyd-test-spawn-" + strconv.Itoa(os.Getpid())
	leaf, err := platform.OpenCgroup(parent + "/" + RuntimeCgroup)
	if err != nil {
		t.Fatal(err)
	}
	id, err := SpawnDetached("test", "/bin/sh", []string{"-c", "cat <&3 >/dev/null; exec sleep 60"}, log, []byte("{}"), parent)
	if err != nil {
		t.Fatal(err)
	}
	b, rerr := os.ReadFile("/proc/" + strconv.Itoa(id.Pid) + "/cgroup")
	_ = platform.SignalVerified(id, syscall.SIGKILL)
	_ = platform.WaitExit(t.Context(), id)
	t.Cleanup(func() {
		for _, d := range leaf.Dirs() {
			_ = os.Remove(d)
			_ = os.Remove(filepath.Dir(d))
		}
	})
	if rerr != nil {
		t.Fatal(rerr)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if v == 2 {
		if got := strings.TrimSpace(string(b)); !strings.HasSuffix(got, "/"+parent+"/"+RuntimeCgroup) {
			t.Fatalf("the runtime process is in %q, want %s/%s", got, parent, RuntimeCgroup)
		}
		return
	}
	if string(b) != string(self) {
		t.Fatalf("on cgroup v1 the runtime process moved: %q, bothyd's %q", b, self)
	}
	if leaf.Exists() {
		t.Fatal("on cgroup v1 a runtime leaf was made")
	}
}
