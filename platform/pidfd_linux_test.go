//go:build linux

package platform

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

func TestWaitExit(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	id, err := Identify(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// Still running: a short wait ends with the context.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := WaitExit(ctx, id); err != context.DeadlineExceeded {
		t.Fatalf("WaitExit on a live process = %v, want the context's deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- WaitExit(context.Background(), id) }()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitExit = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitExit did not return after the process exited")
	}
	// Gone, and its pid perhaps reused: returns at once.
	if err := WaitExit(context.Background(), id); err != nil {
		t.Fatalf("WaitExit on a gone process = %v", err)
	}
}
