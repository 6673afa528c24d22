package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
)

// countingHandler counts the records logged at error level.
type countingHandler struct{ errors atomic.Int32 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.errors.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func TestStorageHealth(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	logs := &countingHandler{}
	var mu sync.Mutex
	faults := map[errcode.Code]int{}
	h := NewStorageHealth(root, slog.New(logs), func(c errcode.Code) { mu.Lock(); faults[c]++; mu.Unlock() })
	defer h.Close()
	if st := h.Status(); st.State != StorageOK || st.Root != root {
		t.Fatalf("a writable root reads %+v, want ok", st)
	}
	var healed atomic.Bool
	h.mu.Lock()
	h.every = time.Millisecond
	h.probe = func() error {
		if healed.Load() {
			return nil
		}
		return &fs.PathError{Op: "probe", Path: filepath.Join(root, "p"), Err: syscall.ENOSPC}
	}
	h.mu.Unlock()

	full := filepath.Join(root, "sandboxes", "a", ".config.json.tmp")
	for i := range 5 {
		err := h.Classify(fmt.Errorf("store: %w", &fs.PathError{Op: "write", Path: full, Err: syscall.ENOSPC}))
		if errcode.Of(err) != errcode.StorageFull || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("request %d: Classify = %v, want storage-full keeping ENOSPC", i, err)
		}
	}
	st := h.Status()
	if st.State != StorageFull || st.Path != full {
		t.Fatalf("after ENOSPC the health is %+v, want full at %s", st, full)
	}
	if n := logs.errors.Load(); n != 1 {
		t.Fatalf("5 faults logged %d errors, want 1 (a change of state, once)", n)
	}
	mu.Lock()
	if faults[errcode.StorageFull] != 5 {
		t.Errorf("counted %d storage-full faults, want 5 (failed probes are not counted)", faults[errcode.StorageFull])
	}
	mu.Unlock()

	// Not the state root's faults: a cgroup's ENOSPC, a sandbox's own disk; nor storage at all.
	cg := &fs.PathError{Op: "write", Path: "/sys/fs/cgroup/x/cgroup.subtree_control", Err: syscall.ENOSPC}
	if got := h.Classify(cg); got != error(cg) {
		t.Errorf("Classify(a cgroup's ENOSPC) = %v, want it unchanged", got)
	}
	disk := errcode.Wrap(errcode.StorageFull, ErrSandboxDiskFull, "the sandbox's disk")
	if got := h.Classify(disk); got != error(disk) {
		t.Errorf("Classify(a sandbox's full disk) = %v, want it unchanged", got)
	}
	if got := h.Classify(&fs.PathError{Op: "open", Path: full, Err: syscall.EMFILE}); errcode.Of(got) != errcode.Unavailable {
		t.Errorf("Classify(EMFILE) = %v, want unavailable", got)
	}

	// The probe heals it; then a read-only root is a new state, logged again.
	healed.Store(true)
	waitFor(t, func() bool { return h.Status().State == StorageOK })
	healed.Store(false)
	err := h.Classify(&fs.PathError{Op: "open", Path: full, Err: syscall.EROFS})
	if errcode.Of(err) != errcode.StorageUnavailable || h.Status().State != StorageUnavailable {
		t.Fatalf("EROFS: %v, health %+v; want storage-unavailable", err, h.Status())
	}
	if n := logs.errors.Load(); n != 2 {
		t.Errorf("logged %d errors, want 2 (full, then unavailable)", n)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("the condition did not hold within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
