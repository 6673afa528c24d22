//go:build linux

package platform

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseStat(t *testing.T) {
	t.Parallel()
	tail := " S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 424242 20 21"
	cases := []struct {
		name, comm string
	}{
		{"plain", "(bash)"},
		{"spaces", "(my prog)"},
		{"parens", "(a) S 9 9 (b))"},
		{"empty", "()"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st, err := parseStat([]byte("123 " + c.comm + tail + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			// utime 11, stime 12, cutime 13, cstime 14.
			if st.StartTime != 424242 || st.PPid != 1 || st.State != 'S' || st.CPUTicks != 50 {
				t.Fatalf("got %+v", st)
			}
		})
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1", "1 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
}

func TestIdentifySelf(t *testing.T) {
	t.Parallel()
	id, err := Identify(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !id.Alive() || id.StartTime == 0 || id.BootID == "" {
		t.Fatalf("self identity %v not alive", id)
	}
	other := id
	other.StartTime++
	if other.Alive() {
		t.Fatal("an identity with another start time reads alive")
	}
	if err := SignalVerified(other, 0); !errors.Is(err, ErrProcessGone) {
		t.Fatalf("SignalVerified of a mismatched identity = %v, want ErrProcessGone", err)
	}
	other = id
	other.BootID = "another-boot"
	if other.Alive() {
		t.Fatal("an identity of another boot reads alive")
	}
}

func TestSignalVerifiedChild(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	id, err := Identify(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// Both ways of finding children find it: the kernel's per-task lists (where the kernel
	// has them) and the scan of /proc.
	for name, children := range map[string]func(int) ([]int, error){"Children": Children, "scanChildren": scanChildren} {
		kids, err := children(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(kids, id.Pid) {
			t.Fatalf("%s(%d) = %v, lacks %d", name, os.Getpid(), kids, id.Pid)
		}
	}
	if kids, err := Children(1 << 30); err != nil || len(kids) != 0 {
		t.Fatalf("Children of a pid that does not exist = %v, %v; want none, no error", kids, err)
	}
	if err := SignalVerified(id, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if id.Alive() {
		t.Fatal("a reaped child reads alive")
	}
	if err := SignalVerified(id, syscall.SIGKILL); !errors.Is(err, ErrProcessGone) {
		t.Fatalf("signal to a dead process = %v, want ErrProcessGone", err)
	}
}

func TestZombieIsGone(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start true: %v", err)
	}
	pid := cmd.Process.Pid
	// Wait for it to exit without reaping it: waitid with WNOWAIT.
	var info [128]byte
	_, _, e := syscall.Syscall6(syscall.SYS_WAITID, 1 /* P_PID */, uintptr(pid), uintptr(unsafePointer(&info[0])), syscall.WEXITED|0x01000000 /* WNOWAIT */, 0, 0)
	if e != 0 {
		t.Fatal(e)
	}
	if _, err := Identify(pid); !errors.Is(err, ErrProcessGone) {
		t.Fatalf("Identify(zombie) = %v, want ErrProcessGone", err)
	}
	_ = cmd.Wait()
}

func TestBootAndClocks(t *testing.T) {
	t.Parallel()
	b, err := BootID()
	if err != nil || len(b) < 16 {
		t.Fatalf("BootID = %q, %v", b, err)
	}
	if _, err := MachineID(); err != nil {
		t.Logf("no machine id on this host: %v", err)
	}
	a, err := Boottime()
	if err != nil {
		t.Fatal(err)
	}
	m, err := Monotonic()
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := Boottime()
	if a <= 0 || m <= 0 || a2 < a || m > a2 {
		t.Fatalf("clocks boottime %v then %v, monotonic %v", a, a2, m)
	}
}

// TestSetOOMScoreAdj: a score goes up for anyone who may write it, down below 0 only with
// CAP_SYS_RESOURCE (which root in a container may lack); one out of range is refused; a
// reaped process is gone.
func TestSetOOMScoreAdj(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	score := func() string {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/oom_score_adj")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if err := SetOOMScoreAdj(pid, 700); err != nil || score() != "700" {
		t.Fatalf("raise to 700: %v, score %s", err, score())
	}
	err := SetOOMScoreAdj(pid, -999)
	switch lower := hasSysResource(t); {
	case lower && (err != nil || score() != "-999"):
		t.Fatalf("lowering to -999 with CAP_SYS_RESOURCE: %v, score %s", err, score())
	case !lower && (err == nil || score() != "700"):
		t.Fatalf("lowering to -999 without CAP_SYS_RESOURCE: %v, score %s", err, score())
	}
	if err := SetOOMScoreAdj(pid, 1001); err == nil {
		t.Fatal("a score of 1001 was accepted")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := SetOOMScoreAdj(pid, 1000); !errors.Is(err, syscall.ESRCH) && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a reaped process: %v, want ESRCH or ENOENT", err)
	}
}

// hasSysResource says whether this thread has CAP_SYS_RESOURCE in effect.
func hasSysResource(t *testing.T) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	return data[0].Effective&(1<<unix.CAP_SYS_RESOURCE) != 0
}

// TestPidTakenByAThreadIsGone: a process whose pid a thread of another process now holds (a
// reused pid; pidfd_open refuses a thread that leads no group, with EINVAL before Linux 6.9
// and ENOENT since) is gone, for a signal and for a wait. A guest run on Linux 6.1 failed a
// kill with "pidfd_open: invalid argument" so; both fail without pidGone.
func TestPidTakenByAThreadIsGone(t *testing.T) {
	t.Parallel()
	tids := make(chan int)
	release := make(chan struct{})
	go func() {
		runtime.LockOSThread() // a thread of this process that is not its leader
		tids <- unix.Gettid()
		<-release
	}()
	tid := <-tids
	defer close(release)
	if tid == os.Getpid() {
		t.Skip("the goroutine ran on the leader thread")
	}
	p := ProcessID{Pid: tid, StartTime: 1, BootID: "gone"}
	if err := SignalVerified(p, syscall.SIGKILL); !errors.Is(err, ErrProcessGone) {
		t.Fatalf("SignalVerified of a pid a thread holds: %v, want ErrProcessGone", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := WaitExit(ctx, p); err != nil {
		t.Fatalf("WaitExit of a pid a thread holds: %v, want nil (gone)", err)
	}
}
