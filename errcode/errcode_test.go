package errcode

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"
	"testing"
)

func TestIsAndOfThroughWrapping(t *testing.T) {
	t.Parallel()
	base := Wrap(SandboxBusy, fs.ErrExist, "Another exec is running; retry later.")
	wrapped := fmt.Errorf("exec: %w", base)
	if !errors.Is(wrapped, SandboxBusy) {
		t.Fatalf("errors.Is(%v, SandboxBusy) = false", wrapped)
	}
	if errors.Is(wrapped, TransitionInProgress) {
		t.Fatalf("errors.Is matched a different code")
	}
	if !errors.Is(wrapped, fs.ErrExist) {
		t.Fatalf("the cause is not reachable through Unwrap")
	}
	if got := Of(wrapped); got != SandboxBusy {
		t.Fatalf("Of = %q, want %q", got, SandboxBusy)
	}
	if got := Of(errors.New("plain")); got != "" {
		t.Fatalf("Of(plain) = %q, want empty", got)
	}
}

func TestStorage(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		err   error
		code  Code
		errno error
		words string
	}{
		{"enospc", &fs.PathError{Op: "write", Path: "/x/sandboxes/a/.config.json.1.tmp", Err: syscall.ENOSPC}, StorageFull, syscall.ENOSPC, "/x is full"},
		{"edquot", fmt.Errorf("store: %w", &fs.PathError{Op: "mkdir", Path: "/x/a", Err: syscall.EDQUOT}), StorageFull, syscall.EDQUOT, "free space"},
		{"erofs", &fs.PathError{Op: "open", Path: "/x/a", Err: syscall.EROFS}, StorageUnavailable, syscall.EROFS, "is read-only"},
		{"eio", &fs.PathError{Op: "fsync", Path: "/x/a", Err: syscall.EIO}, StorageUnavailable, syscall.EIO, "I/O errors"},
		{"under another code", Wrap(Internal, syscall.ENOSPC, "x"), StorageFull, syscall.ENOSPC, "/x is full"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Storage(tc.err, "/x")
			if Of(got) != tc.code {
				t.Fatalf("Storage(%v) has code %q, want %q", tc.err, Of(got), tc.code)
			}
			if !errors.Is(got, tc.errno) {
				t.Fatalf("Storage(%v) lost its errno %v", tc.err, tc.errno)
			}
			var e *Error
			errors.As(got, &e)
			if !strings.Contains(e.Msg, tc.words) || !strings.Contains(e.Msg, "/x") {
				t.Fatalf("message %q does not name the state root or say %q", e.Msg, tc.words)
			}
			if again := Storage(got, "/y"); again != got {
				t.Fatalf("Storage wrapped its own result again: %v", again)
			}
		})
	}
	for _, err := range []error{nil, syscall.EACCES, fs.ErrNotExist, New(SandboxBusy, "busy")} {
		if got := Storage(err, "/x"); got != err {
			t.Errorf("Storage(%v) = %v, want it unchanged", err, got)
		}
	}
}
