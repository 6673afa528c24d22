package handlers

import (
	"fmt"
	"testing"

	"github.com/bothy/bothy/errcode"
)

func TestFileOpBounds(t *testing.T) {
	t.Parallel()
	var b bounds
	var releases []func()
	for range MaxFileOpsPerSandbox {
		r, err := b.admitFileOp("a")
		if err != nil {
			t.Fatalf("admitting within the bound: %v", err)
		}
		releases = append(releases, r)
	}
	if _, err := b.admitFileOp("a"); errcode.Of(err) != errcode.SandboxBusy {
		t.Fatalf("one past the per-sandbox bound: %v, want sandbox-busy", err)
	}
	// A release counts once, however often it is called.
	releases[0]()
	releases[0]()
	r, err := b.admitFileOp("a")
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := b.admitFileOp("a"); errcode.Of(err) != errcode.SandboxBusy {
		t.Fatalf("a double release freed two slots: %v", err)
	}
	releases[0] = r
	// The server-wide bound, across sandboxes.
	for i := MaxFileOpsPerSandbox; i < MaxFileOps; i++ {
		r, err := b.admitFileOp(string(rune('b' + i%20)))
		if err != nil {
			t.Fatalf("admitting op %d within the total: %v", i, err)
		}
		releases = append(releases, r)
	}
	if _, err := b.admitFileOp("z"); errcode.Of(err) != errcode.Unavailable {
		t.Fatalf("one past the total: %v, want unavailable", err)
	}
	for _, r := range releases {
		r()
	}
	if b.fileOps != 0 || len(b.perSandbox) != 0 {
		t.Fatalf("after every release: %d ops, %v per sandbox; want none", b.fileOps, b.perSandbox)
	}
}

func TestExecAndEventBounds(t *testing.T) {
	t.Parallel()
	var b bounds
	for range MaxExecs {
		if _, err := b.admitExec(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.admitExec(); errcode.Of(err) != errcode.Unavailable {
		t.Fatalf("one exec past the bound: %v, want unavailable", err)
	}
	for range MaxEventStreams {
		if _, err := b.admitEventStream(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.admitEventStream(); errcode.Of(err) != errcode.LimitReached {
		t.Fatalf("one event stream past the bound: %v, want limit-reached", err)
	}
}

// A volume's file operations are bounded per volume (limit-reached) and count against the
// server's total with the sandboxes' (unavailable).
func TestVolumeFileOpBounds(t *testing.T) {
	t.Parallel()
	var b bounds
	var releases []func()
	for range MaxFileOpsPerVolume {
		r, err := b.admitVolumeFileOp("v")
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, r)
	}
	if _, err := b.admitVolumeFileOp("v"); errcode.Of(err) != errcode.LimitReached {
		t.Fatalf("one past the volume's bound: %v", err)
	}
	releases[0]()
	releases[0]() // a second release is a no-op
	r, err := b.admitVolumeFileOp("v")
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	releases[0] = r
	for i := MaxFileOpsPerVolume; i < MaxFileOps; i++ {
		r, err := b.admitFileOp(fmt.Sprintf("sb-%d", i%64))
		if err != nil {
			t.Fatalf("sandbox op %d: %v", i, err)
		}
		releases = append(releases, r)
	}
	if _, err := b.admitVolumeFileOp("w"); errcode.Of(err) != errcode.Unavailable {
		t.Fatalf("one past the server's total: %v", err)
	}
	for _, r := range releases {
		r()
	}
	if b.fileOps != 0 || len(b.perVolume) != 0 || len(b.perSandbox) != 0 {
		t.Fatalf("after every release: %d ops, %v, %v", b.fileOps, b.perVolume, b.perSandbox)
	}
}
