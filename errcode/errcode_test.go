package errcode

import (
	"errors"
	"fmt"
	"io/fs"
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
