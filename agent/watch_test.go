package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bothy/bothy/control"
)

// events reads a watch's events in order across batches.
type events struct {
	w       *control.DirWatch
	pending []control.WatchEvent
}

// waitEvent reads events until want (name and op) arrived, and returns those read up to it;
// those after it stay for the next call. It fails the test when the watch ends first; the
// watch is closed at its deadline.
func waitEvent(t *testing.T, e *events, want control.WatchEvent) []control.WatchEvent {
	t.Helper()
	timer := time.AfterFunc(20*time.Second, func() { e.w.Close() })
	defer timer.Stop()
	var seen []control.WatchEvent
	for {
		for len(e.pending) > 0 {
			ev := e.pending[0]
			e.pending = e.pending[1:]
			seen = append(seen, ev)
			if ev == want {
				return seen
			}
		}
		evs, err := e.w.Next()
		if err != nil {
			t.Fatalf("waiting for %v: %v (after %v)", want, err, seen)
		}
		e.pending = evs
	}
}

func TestWatchRecursive(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	dir := worldDir(t)
	ctx := context.Background()
	w, err := c.Watch(ctx, control.WatchRequest{Path: dir, User: control.Root, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ev := &events{w: w}

	f := filepath.Join(dir, "a.txt")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ev, control.WatchEvent{Name: "a.txt", Op: control.WatchCreate})
	waitEvent(t, ev, control.WatchEvent{Name: "a.txt", Op: control.WatchWrite})
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ev, control.WatchEvent{Name: "a.txt", Op: control.WatchChmod})

	// A directory made after the watch started is watched too, before its creation is
	// reported.
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ev, control.WatchEvent{Name: "sub", Op: control.WatchCreate})
	if err := os.WriteFile(filepath.Join(dir, "sub", "b.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ev, control.WatchEvent{Name: "sub/b.txt", Op: control.WatchCreate})
	if err := os.Rename(f, filepath.Join(dir, "sub", "c.txt")); err != nil {
		t.Fatal(err)
	}
	// A rename within the watch is its old name's rename and its new name's create.
	waitEvent(t, ev, control.WatchEvent{Name: "a.txt", Op: control.WatchRename})
	waitEvent(t, ev, control.WatchEvent{Name: "sub/c.txt", Op: control.WatchCreate})
	if err := os.Remove(filepath.Join(dir, "sub", "b.txt")); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ev, control.WatchEvent{Name: "sub/b.txt", Op: control.WatchRemove})

	// The watched directory's own end ends the watch.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(20*time.Second, func() { w.Close() })
	defer timer.Stop()
	for {
		_, err := w.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the watch of a removed directory ended with %v, want its end", err)
		}
	}
}

func TestWatchNotRecursive(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	dir := worldDir(t)
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(context.Background(), control.WatchRequest{Path: dir, User: control.Root})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := os.WriteFile(filepath.Join(dir, "sub", "deep.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "top.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	evs := waitEvent(t, &events{w: w}, control.WatchEvent{Name: "top.txt", Op: control.WatchCreate})
	for _, ev := range evs {
		if strings.HasPrefix(ev.Name, "sub/") {
			t.Fatalf("a watch without recursive reported %v", ev)
		}
	}
}

func TestWatchErrors(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	dir := worldDir(t)
	ctx := context.Background()
	if _, err := c.Watch(ctx, control.WatchRequest{Path: filepath.Join(dir, "nope")}); err == nil {
		t.Fatal("watching a missing directory succeeded")
	}
	f := filepath.Join(dir, "f")
	os.WriteFile(f, nil, 0o644)
	if _, err := c.Watch(ctx, control.WatchRequest{Path: f}); err == nil || !strings.Contains(err.Error(), control.CodeNotADirectory) {
		t.Fatalf("watching a file: %v, want %s", err, control.CodeNotADirectory)
	}
	if !isRoot() {
		return
	}
	private := filepath.Join(dir, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Watch(ctx, control.WatchRequest{Path: private, User: control.User}); err == nil || !strings.Contains(err.Error(), control.CodePermissionDenied) {
		t.Fatalf("the user watching root's private directory: %v, want %s", err, control.CodePermissionDenied)
	}
}

// A client that does not read loses events past the agent's bound, and is told so by one
// overflow event, instead of the agent holding everything.
func TestWatchOverflow(t *testing.T) {
	ta := startAgent(t)
	c := ta.dial(t)
	dir := worldDir(t)
	w, err := c.Watch(context.Background(), control.WatchRequest{Path: dir, User: control.Root})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Far more than the stream's window, the agent's queue and the kernel's queue hold.
	const n = 40000
	for i := range n {
		name := filepath.Join(dir, fmt.Sprintf("a-file-with-a-rather-long-name-to-fill-the-window-%06d", i))
		if err := os.WriteFile(name, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "last"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	evs := waitEvent(t, &events{w: w}, control.WatchEvent{Op: control.WatchOverflow})
	if len(evs) >= n {
		t.Fatalf("%d events before the overflow, want fewer than %d", len(evs), n)
	}
}
