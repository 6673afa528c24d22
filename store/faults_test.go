package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bothy/bothy/errcode"
	"github.com/bothy/bothy/platform"
)

// injector is a platform.FS fault that, once armed, counts the changing operations and fails
// the at-th of them (sticky: that one and every one after it) with errno. Armed with at 0 it
// only counts, which is how a test learns how many steps a transaction has.
type injector struct {
	mu     sync.Mutex
	armed  bool
	at     int
	sticky bool
	errno  error
	ops    []string
}

func (in *injector) fault(op platform.Op, path string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.armed {
		return nil
	}
	name := filepath.Base(path)
	if strings.Contains(path, string(filepath.Separator)+TrashDir+string(filepath.Separator)) {
		name = trashStep + name
	}
	in.ops = append(in.ops, fmt.Sprintf("%s %s", op, name))
	n := len(in.ops)
	if in.at > 0 && (n == in.at || in.sticky && n > in.at) {
		return in.errno
	}
	return nil
}

func (in *injector) arm(at int, sticky bool, errno error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.armed, in.at, in.sticky, in.errno, in.ops = true, at, sticky, errno, nil
}

// disarm stops the faults and returns the operations seen since arm.
func (in *injector) disarm() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.armed = false
	return in.ops
}

// trashStep marks the steps that move entries into the trash: a removal whose move fails
// removes the entry in place instead, so a fault there may leave the removal successful.
const trashStep = "trash:"

// faultMode is how an injected fault behaves: a full disk that fails one step (and lets the
// undo run), or a file system that turns read-only at a step and fails everything after it
// (the undo too).
type faultMode struct {
	name   string
	sticky bool
	errno  syscall.Errno
	code   errcode.Code
}

var faultModes = []faultMode{
	{"full-once", false, syscall.ENOSPC, errcode.StorageFull},
	{"readonly-from-then-on", true, syscall.EROFS, errcode.StorageUnavailable},
}

// storeTx is one transaction of the sandbox store, run with faults armed on a sandbox "a"
// that setup prepared; check judges the state after a failure, with a store whose file
// system works again.
type storeTx struct {
	name  string
	setup func(t *testing.T, s *Store)
	run   func(t *testing.T, s *Store) error
	check func(t *testing.T, s *Store, mode faultMode)
}

// TestFaultAtEveryStep fails each changing file-system step of each transaction of the
// sandbox store in turn, once with ENOSPC (the undo may run) and once with EROFS from that
// step on (the undo fails too), and checks that the error carries the storage code and the
// errno, and that what is left is a state the next transition accepts, with no record that
// lies: a failed write leaves no new record (or, when its undo could not run, a whole one),
// and the next lock of the sandbox leaves the state directory clean.
func TestFaultAtEveryStep(t *testing.T) {
	t.Parallel()
	for _, tx := range storeTxs() {
		t.Run(tx.name, func(t *testing.T) {
			t.Parallel()
			steps := countSteps(t, tx)
			if len(steps) == 0 {
				t.Fatalf("%s makes no changing step; the test is broken", tx.name)
			}
			for _, mode := range faultModes {
				for at := 1; at <= len(steps); at++ {
					t.Run(fmt.Sprintf("%s/%d-%s", mode.name, at, strings.ReplaceAll(steps[at-1], " ", ":")), func(t *testing.T) {
						runFaulted(t, tx, mode, at)
					})
				}
			}
		})
	}
}

// countSteps runs tx without a fault and returns its changing steps.
func countSteps(t *testing.T, tx storeTx) []string {
	t.Helper()
	in := &injector{}
	s := openFaulty(t, t.TempDir(), in)
	tx.setup(t, s)
	in.arm(0, false, nil)
	err := tx.run(t, s)
	steps := in.disarm()
	if err != nil {
		t.Fatalf("%s without a fault: %v", tx.name, err)
	}
	return steps
}

func runFaulted(t *testing.T, tx storeTx, mode faultMode, at int) {
	root := t.TempDir()
	in := &injector{}
	s := openFaulty(t, root, in)
	tx.setup(t, s)
	in.arm(at, mode.sticky, mode.errno)
	err := tx.run(t, s)
	steps := in.disarm()
	if len(steps) < at {
		t.Fatalf("the fault at step %d was never reached (steps %v, err %v)", at, steps, err)
	}
	if err == nil && strings.Contains(steps[at-1], trashStep) && !mode.sticky {
		// The removal deleted in place what it could not move: it must have finished.
		clean := openStore(t, root)
		if provisioned(t, clean, "a") {
			t.Fatalf("failing step %d (%s): the removal succeeded but left the sandbox", at, steps[at-1])
		}
		settle(t, clean, "a")
		return
	}
	if err == nil {
		t.Fatalf("failing step %d (%s) went unnoticed: the transaction succeeded", at, steps[at-1])
	}
	if errcode.Of(err) != mode.code || !errors.Is(err, mode.errno) {
		t.Fatalf("failing step %d (%s): err = %v; want code %s wrapping %v", at, steps[at-1], err, mode.code, mode.errno)
	}
	if !strings.Contains(messageOf(err), root) {
		t.Fatalf("the message %q does not name the state root %s", messageOf(err), root)
	}
	clean := openStore(t, root)
	tx.check(t, clean, mode)
	settle(t, clean, "a")
}

func openFaulty(t *testing.T, root string, in *injector) *Store {
	t.Helper()
	s, err := OpenWith(root, Options{FS: platform.FS{Fault: in.fault}})
	if err != nil {
		t.Fatal(err)
	}
	declareAll(t, s)
	t.Cleanup(func() { s.Close() })
	return s
}

func messageOf(err error) string {
	var e *errcode.Error
	if errors.As(err, &e) {
		return e.Msg
	}
	return ""
}

// settle is the next transition: it locks the sandbox as any transition would and checks
// that the state directory is then clean: gone when the sandbox is not provisioned, and
// otherwise holding no temp leftover of a locked record and a configuration record that
// reads whole.
func settle(t *testing.T, s *Store, id string) {
	t.Helper()
	l, err := s.LockExisting(timeout(t, 5*time.Second), id)
	dir := filepath.Join(s.Root(), SandboxesDir, id)
	if errors.Is(err, errcode.SandboxNotFound) {
		if exists(dir) {
			t.Fatalf("an unprovisioned sandbox left its state directory: %v", entriesOf(t, dir))
		}
		if ids, _ := s.List(); slices.Contains(ids, id) {
			t.Fatalf("List shows the unprovisioned %s", id)
		}
		return
	}
	if err != nil {
		t.Fatalf("the next transition cannot lock %s: %v", id, err)
	}
	defer l.Unlock()
	c, err := l.Config()
	if err != nil || c.ID != id {
		t.Fatalf("the configuration record of %s does not read whole: %+v, %v", id, c, err)
	}
	for _, name := range entriesOf(t, dir) {
		if target, ok := platform.IsTempName(name); ok && slices.Contains(lockedRecords, target) {
			t.Fatalf("the lock left the temp leftover %s", name)
		}
	}
	for _, read := range []func() error{
		func() error { _, err := l.LaunchJournal(); return err },
		func() error { _, err := l.RuntimeRecord(); return err },
	} {
		if err := read(); err != nil {
			t.Fatalf("a record of %s does not read: %v", id, err)
		}
	}
}

// provisioned reports whether id reads as provisioned, failing on a record that does not read.
func provisioned(t *testing.T, s *Store, id string) bool {
	t.Helper()
	_, err := s.ReadConfigUnlocked(id)
	if errors.Is(err, errcode.SandboxNotFound) {
		return false
	}
	if err != nil {
		t.Fatalf("the configuration record of %s does not read: %v", id, err)
	}
	return true
}

func journal(pid int) *LaunchJournal {
	return &LaunchJournal{LaunchID: "l1", RuntimeID: "rt", StartedAt: time.Unix(1700000000, 0).UTC(), Pid: pid}
}

func storeTxs() []storeTx {
	withLock := func(fn func(l *Lock) error) func(t *testing.T, s *Store) error {
		return func(t *testing.T, s *Store) error {
			l, err := s.LockExisting(timeout(t, 5*time.Second), "a")
			if err != nil {
				return err
			}
			return errors.Join(fn(l), l.Unlock())
		}
	}
	nothing := func(t *testing.T, s *Store) {}
	provisionA := func(t *testing.T, s *Store) { provision(t, s, "a") }
	journaled := func(t *testing.T, s *Store) {
		provision(t, s, "a")
		l := lockExisting(t, s, "a")
		if err := l.WriteLaunchJournal(journal(0)); err != nil {
			t.Fatal(err)
		}
		l.Unlock()
	}
	recorded := func(t *testing.T, s *Store) {
		journaled(t, s)
		l := lockExisting(t, s, "a")
		if err := l.WriteRuntimeRecord(&RuntimeRecord{LaunchID: "l1", Pid: 7}); err != nil {
			t.Fatal(err)
		}
		l.Unlock()
	}
	// freeOrWhole accepts, after a failed write of a record that did not exist, no record
	// (the undo ran) or, only when the undo itself failed, a whole one.
	freeOrWhole := func(read func(l *Lock) (bool, error)) func(t *testing.T, s *Store, mode faultMode) {
		return func(t *testing.T, s *Store, mode faultMode) {
			l := lockExisting(t, s, "a")
			defer l.Unlock()
			found, err := read(l)
			if err != nil {
				t.Fatalf("the record does not read whole: %v", err)
			}
			if found && !mode.sticky {
				t.Fatal("a failed write left its record, though its undo could run")
			}
		}
	}
	return []storeTx{
		{
			name:  "provision",
			setup: nothing,
			run: func(t *testing.T, s *Store) error {
				l, err := s.LockForProvision(timeout(t, 5*time.Second), "a")
				if err != nil {
					return err
				}
				if err := l.RequireUnprovisioned(); err != nil {
					return errors.Join(err, l.Unlock())
				}
				return errors.Join(l.WriteConfig(config("a")), l.Unlock())
			},
			check: func(t *testing.T, s *Store, mode faultMode) {
				if mode.sticky {
					return // the undo failed too: settle judges what it left
				}
				if provisioned(t, s, "a") {
					t.Fatal("a provision that failed left the sandbox provisioned, though its undo could run")
				}
				// A directory without config.json is what bothyd check reports as left over.
				if dir := filepath.Join(s.Root(), SandboxesDir, "a"); exists(dir) {
					t.Fatalf("a provision that failed left its state directory: %v", entriesOf(t, dir))
				}
			},
		},
		{
			name:  "journal-write",
			setup: provisionA,
			run:   withLock(func(l *Lock) error { return l.WriteLaunchJournal(journal(0)) }),
			check: freeOrWhole(func(l *Lock) (bool, error) { j, err := l.LaunchJournal(); return j != nil, err }),
		},
		{
			name:  "journal-rewrite",
			setup: journaled,
			run:   withLock(func(l *Lock) error { return l.WriteLaunchJournal(journal(42)) }),
			check: func(t *testing.T, s *Store, mode faultMode) {
				j, err := s.ReadLaunchJournalUnlocked("a")
				if err != nil || j == nil || (j.Pid != 0 && j.Pid != 42) {
					t.Fatalf("after a failed rewrite the journal reads %+v, %v; want the old or the new, whole", j, err)
				}
			},
		},
		{
			name:  "runtime-record-write",
			setup: journaled,
			run:   withLock(func(l *Lock) error { return l.WriteRuntimeRecord(&RuntimeRecord{LaunchID: "l1", Pid: 7}) }),
			check: freeOrWhole(func(l *Lock) (bool, error) { r, err := l.RuntimeRecord(); return r != nil, err }),
		},
		{
			name:  "journal-remove",
			setup: recorded,
			run:   withLock(func(l *Lock) error { return l.RemoveLaunchJournal() }),
			check: func(t *testing.T, s *Store, mode faultMode) {
				if _, err := s.ReadLaunchJournalUnlocked("a"); err != nil {
					t.Fatalf("the journal does not read: %v", err)
				}
			},
		},
		{
			name: "remove",
			setup: func(t *testing.T, s *Store) {
				provision(t, s, "a")
				populate(t, filepath.Join(s.Root(), SandboxesDir, "a"))
			},
			run: func(t *testing.T, s *Store) error {
				return withLock(func(l *Lock) error { return l.Deprovision(timeout(t, 5*time.Second)) })(t, s)
			},
			check: func(t *testing.T, s *Store, mode faultMode) {
				// An interrupted removal leaves a provisioned sandbox that removing again
				// finishes, or none at all.
				if !provisioned(t, s, "a") {
					return
				}
				l := lockExisting(t, s, "a")
				if err := l.Deprovision(timeout(t, 5*time.Second)); err != nil {
					t.Fatalf("removing again after a failed removal: %v", err)
				}
			},
		},
	}
}

// TestRemovalNeedsNoSpace deletes a sandbox on a disk that refuses every step that needs
// space (creating, writing, renaming, making a directory), as a full disk does: a delete is
// how a user frees space, so it must need none of them (it tries the trash, and deletes in
// place when that is refused). Reads and lists work as well.
func TestRemovalNeedsNoSpace(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var mu sync.Mutex
	var refused []string
	full := func(op platform.Op, path string) error {
		switch op {
		case platform.OpCreate, platform.OpWrite, platform.OpRename, platform.OpMkdir:
			mu.Lock()
			refused = append(refused, fmt.Sprintf("%s %s", op, path))
			mu.Unlock()
			return syscall.ENOSPC
		}
		return nil
	}
	good := openStore(t, root)
	provision(t, good, "a")
	provision(t, good, "b")
	populate(t, filepath.Join(root, SandboxesDir, "a"))

	s, err := OpenWith(root, Options{FS: platform.FS{Fault: full}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	declareAll(t, s)
	if ids, err := s.List(); err != nil || !slices.Equal(ids, []string{"a", "b"}) {
		t.Fatalf("List on a full disk = %v, %v", ids, err)
	}
	if _, err := s.ReadConfigUnlocked("a"); err != nil {
		t.Fatalf("a read on a full disk: %v", err)
	}
	_, err = s.LockForProvision(timeout(t, 5*time.Second), "c")
	wantCode(t, err, errcode.StorageFull)
	if exists(filepath.Join(root, SandboxesDir, "c")) {
		t.Fatal("a provision refused for a full disk left a state directory")
	}

	l, err := s.LockExisting(timeout(t, 5*time.Second), "a")
	if err != nil {
		t.Fatalf("locking for a delete on a full disk: %v", err)
	}
	if err := l.Deprovision(timeout(t, 5*time.Second)); err != nil {
		t.Fatalf("a delete on a full disk: %v", err)
	}
	l.Unlock()
	if _, err := os.Lstat(filepath.Join(root, SandboxesDir, "a")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the deleted sandbox's directory remains: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range refused {
		// The delete tries to move the entries into the trash (which needs space), and
		// removes them in place when it cannot.
		if !strings.Contains(r, string(filepath.Separator)+"c") && !strings.Contains(r, filepath.Join(root, TrashDir)+string(filepath.Separator)) {
			t.Errorf("the delete or a read needed space: %s", r)
		}
	}
}
