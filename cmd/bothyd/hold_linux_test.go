package main

import (
	"bytes"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHoldRefusesWithoutSystemd: run by hand, `bothyd hold` says what it is for and exits 2
// at once, touching no cgroup.
func TestHoldRefusesWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	var stderr bytes.Buffer
	if code := holdCommand(nil, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2; stderr: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "bothy-sandboxes.service") {
		t.Fatalf("the refusal does not say what hold is for: %s", stderr.String())
	}
}

// TestHoldCgroupV1: on a host without a cgroup v2 hierarchy, `bothyd hold` under a (fake)
// systemd says there is nothing to hold, tells systemd READY=1, waits, and exits 0 on
// SIGTERM, as systemd stops a unit.
func TestHoldCgroupV1(t *testing.T) {
	var fs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &fs); err != nil {
		t.Skipf("no /sys/fs/cgroup: %v", err)
	}
	if fs.Type == unix.CGROUP2_SUPER_MAGIC {
		t.Skip("cgroup v2 host: hold would move this test into a leaf of its cgroup; the guest suite runs the v2 hold under systemd")
	}
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)

	var stderr bytes.Buffer
	exit := make(chan int, 1)
	go func() { exit <- holdCommand(nil, &stderr) }()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 4096)
	n, err := conn.Read(b)
	if err != nil {
		t.Fatalf("no READY=1: %v", err)
	}
	if got := string(b[:n]); !strings.HasPrefix(got, "READY=1\nSTATUS=cgroup v1") {
		t.Fatalf("notification %q", got)
	}
	select {
	case code := <-exit:
		t.Fatalf("hold exited (%d) before it was stopped", code)
	default:
	}
	// hold's signal.NotifyContext is registered before READY=1 is sent, so this SIGTERM ends
	// its wait and not the test.
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d on SIGTERM, want 0; stderr: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("hold did not end on SIGTERM")
	}
	if !strings.Contains(stderr.String(), "no cgroup v2 hierarchy") {
		t.Fatalf("hold does not say why it holds nothing: %s", stderr.String())
	}
}
